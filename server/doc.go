// Package server is the daemon's cache protocol (package wire): the
// sessions of clients on the local Unix socket, who share the RAM tier's
// arena and move chunk bytes without a copy, and on TCP, where the bytes
// travel in frames. It owns the connections and their limits (how many,
// how long a frame may take, how much large metadata may be buffered),
// scope handles, per-operation metrics, and the list of leases each
// connection holds so that they end when it closes.
//
// Everything about storage is the engine's: the server resolves a
// request's keys, calls one engine operation and writes the reply. Leases
// too are the engine's (one table, one expiry rule, one reaper); the HTTP
// admin API is package admin and KV-event publishing package
// kvevents/announce, both wired beside this one by cmd/kvtier.
package server
