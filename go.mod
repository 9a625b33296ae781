module github.com/softuvm/softuvm

go 1.26.0

require (
	github.com/cilium/ebpf v0.22.0
	github.com/prometheus/procfs v0.23.0
	github.com/stretchr/testify v1.12.1
	golang.org/x/sys v0.49.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect

tool github.com/cilium/ebpf/cmd/bpf2go
