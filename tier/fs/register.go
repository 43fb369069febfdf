package fs

import "kvtier/tier/remote"

func init() { remote.Register("fs", Open) }
