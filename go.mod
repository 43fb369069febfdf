module kvtier

go 1.26.0

require (
	github.com/fxamacker/cbor/v2 v2.9.6
	github.com/spf13/cobra v1.10.2
	github.com/zeebo/xxh3 v1.1.0
	golang.org/x/sys v0.49.0
	gopkg.in/yaml.v3 v3.0.1
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	github.com/x448/float16 v0.8.4 // indirect
)
