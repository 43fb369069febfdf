// Package deploy holds kvtier's deployment artifacts — the container image
// (Dockerfile), the Helm chart (helm/kvtier), the systemd units (systemd)
// and the Grafana dashboard (grafana) — and the tests that check them
// without a cluster or a Docker engine: the chart is rendered with helm and
// every manifest decoded strictly with the Kubernetes API types, the
// rendered configurations are loaded by kvtier's own loaders, the units and
// the Dockerfile are parsed, and the dashboard's queries are matched
// against the metrics a running daemon exports. See docs/deploy.md.
package deploy
