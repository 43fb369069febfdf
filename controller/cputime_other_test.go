//go:build !linux

package controller

import "time"

// threadCPU is not measured here: the CPU figures read 0.
func threadCPU() time.Duration { return 0 }
