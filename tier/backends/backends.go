// Package backends links every remote tier backend into the program, so
// that remote.Open knows all their URL schemes: redis:// (and its TLS,
// cluster and sentinel forms, and valkey://), s3://, fs:// and kvtier://.
// Import it for its side effect, the way database/sql drivers are.
package backends

import (
	_ "kvtier/tier/fs"
	_ "kvtier/tier/kvtier"
	_ "kvtier/tier/redis"
	_ "kvtier/tier/s3"
)
