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
	case 4:
		return p
	case 5:
		return p / (1 - min(p, 0.95))
	case 6:
		return p * p
	case 7:
		return p * float32(envF("KVX_S", 1))
	}
	return sum / float32(int(depth)+1)
}

var (
	rpForm = int(envF("KVX_F", 0))
	rpCap  = envF("KVX_K", 3)
)

var rpAdapt = envF("KVX_A", 0)

func rpShape(p, credit float64) float64 {
	if rpAdapt > 0 {
		return credit * p
	}
	switch rpForm {
	case 1:
		return min(rpCredit*p, rpCap)
	case 2:
		return rpCredit * p / (1 - min(p, 0.95))
	case 3:
		return rpCredit * p * p
	}
	return rpCredit * p
}

var rpNoHits = envF("KVX_H", 0) == 1

var rpNoDepth = envF("KVX_D", 0) == 1
