package redis

import "kvtier/tier/remote"

func init() {
	for scheme := range schemes {
		remote.Register(scheme, Open)
	}
}
