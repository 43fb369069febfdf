// Package netallow decides whether a daemon may connect to an address a
// client named, against an allow-list from the daemon's configuration.
//
// An entry is one of
//
//	host:port   that host at that port only
//	host        that host at any port
//	prefix/len  any IP address in that CIDR block, at any port
//
// where a host is an IP address (IPv6 in brackets with a port) or a name.
// A name matches only the same name (case and a trailing dot aside), never
// the addresses it resolves to, and a CIDR block matches only destinations
// given as IP addresses: so what is checked is exactly what is dialled,
// and a name whose DNS answer changes cannot slip into a block.
package netallow

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// List is a parsed allow-list. The zero List (no entries) allows the
// loopback addresses only: see Allowed.
type List struct {
	entries []entry
}

type entry struct {
	prefix netip.Prefix // valid for a CIDR block
	addr   netip.Addr   // valid for an IP host
	name   string       // a host name, lower case, no trailing dot
	port   string       // "" for any port
}

// Parse reads entries as described in the package comment.
func Parse(entries []string) (*List, error) {
	l := &List{entries: make([]entry, 0, len(entries))}
	for _, s := range entries {
		e, err := parseEntry(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		l.entries = append(l.entries, e)
	}
	return l, nil
}

func parseEntry(s string) (entry, error) {
	if s == "" {
		return entry{}, fmt.Errorf("an empty entry")
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return entry{}, fmt.Errorf("%q is not a CIDR block: %v", s, err)
		}
		return entry{prefix: p.Masked()}, nil
	}
	host, port := s, ""
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		host = s[1 : len(s)-1] // an IPv6 address without a port
	} else if h, p, err := net.SplitHostPort(s); err == nil {
		if p == "" {
			return entry{}, fmt.Errorf("%q has an empty port", s)
		}
		host, port = h, p
	} else if strings.HasPrefix(s, "[") || strings.Count(s, ":") == 1 {
		return entry{}, fmt.Errorf("%q is not host, host:port or a CIDR block: %v", s, err)
	}
	if host == "" {
		return entry{}, fmt.Errorf("%q has no host", s)
	}
	e := entry{port: port}
	if a, err := netip.ParseAddr(host); err == nil {
		e.addr = a.Unmap()
	} else {
		e.name = canonicalName(host)
	}
	return e, nil
}

func canonicalName(h string) string { return strings.ToLower(strings.TrimSuffix(h, ".")) }

// Len returns the number of entries.
func (l *List) Len() int {
	if l == nil {
		return 0
	}
	return len(l.entries)
}

// Allowed reports whether dest (host:port) may be dialled, and if not,
// why. With no entries (a nil or empty List) only IP loopback addresses
// are allowed.
func (l *List) Allowed(dest string) error {
	host, port, err := net.SplitHostPort(dest)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %v", dest, err)
	}
	addr, aerr := netip.ParseAddr(host)
	isIP := aerr == nil
	addr = addr.Unmap()
	if l.Len() == 0 {
		if isIP && addr.IsLoopback() {
			return nil
		}
		return fmt.Errorf("%s is not a loopback IP address, and no allow-list is configured", dest)
	}
	name := canonicalName(host)
	for _, e := range l.entries {
		if e.port != "" && e.port != port {
			continue
		}
		switch {
		case e.prefix.IsValid():
			if isIP && e.prefix.Contains(addr) {
				return nil
			}
		case e.addr.IsValid():
			if isIP && e.addr == addr {
				return nil
			}
		case !isIP && e.name == name:
			return nil
		}
	}
	return fmt.Errorf("%s is not in the allow-list", dest)
}
