// Package metricstest is what the tests of `uvm serve --metrics` share:
// a scrape of the endpoint parsed as the Prometheus text format, and its
// samples flattened to compare with the statistics they come from.
package metricstest
