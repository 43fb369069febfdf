package policy

import (
	"os"
	"strconv"
)

var (
	rpCredit = envF("KVX_C", 4)
	rpOffset = envF("KVX_O", 0)
	gdMode   = int(envF("KVX_G", 0))
)

func envF(k string, d float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(k), 64); err == nil {
		return v
	}
	return d
}

func gdValue(sum, p float32, depth uint8) float32 {
	switch gdMode {
	case 1:
		return p
	case 2:
		return sum / float32(int(depth)+1) * p
	}
	return sum / float32(int(depth)+1)
}
