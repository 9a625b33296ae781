// Package metrics exposes a fault server's statistics in the Prometheus
// text format, as `uvm serve --metrics ADDR` serves them at /metrics.
//
// A Collector holds no counters of its own: each scrape takes one
// snapshot of the server (core.Stats, the numbers `uvm stat` shows, and
// optionally config.Info for gauges of devices and sessions) and reports
// exactly its values as constant metrics. Two scrapes with no activity
// in between therefore read the same numbers as `uvm stat --json`.
//
// Every metric is named softuvm_*. Processors are labelled "cpu" for
// the host and the device index ("0", "1", ...) for a device, rather
// than core.Device's String ("device 0"), so that label values have no
// spaces and a PromQL selector reads processor="0". The registry also
// has the Go runtime's and the process's collectors (go_*, process_*).
// docs/usage.md lists the metrics.
//
// Endpoints listen on loopback addresses only, unless their caller
// allows any address: the statistics say what programs on the machine
// do, and nothing authenticates a scrape.
package metrics
