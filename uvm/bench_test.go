package uvm

import (
	"testing"
)

// BenchmarkHostFault measures one 4 KiB host fault served by a private
// server, prefetch off: the time per op is the latency of one fault.
func BenchmarkHostFault(b *testing.B) {
	s := newSession(b, testServerConfig())
	const pages = 4096
	var a *Allocation
	next := pages
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if next == pages {
			b.StopTimer()
			if a != nil {
				a.Free()
			}
			var err error
			if a, err = s.MallocManaged(pages*PageSize, WithPrefetch(PrefetchSpec{Policy: "none"})); err != nil {
				b.Fatal(err)
			}
			next = 0
			b.StartTimer()
		}
		a.Bytes()[next*PageSize] = 1
		next++
	}
}

// BenchmarkFirstTouch measures a sequential first touch of 64 MiB with
// the default prefetch; the custom metric is nanoseconds per page.
func BenchmarkFirstTouch(b *testing.B) {
	s := newSession(b, testServerConfig())
	const size = 64 << 20
	for i := 0; i < b.N; i++ {
		a, err := s.MallocManaged(size)
		if err != nil {
			b.Fatal(err)
		}
		buf := a.Bytes()
		for p := 0; p < size; p += PageSize {
			buf[p] = 1
		}
		b.StopTimer()
		a.Free()
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size/PageSize), "ns/page")
}

// BenchmarkDeviceToHost measures reading 32 MiB back from device 0; the
// custom metric is the bandwidth.
func BenchmarkDeviceToHost(b *testing.B) {
	s := newSession(b, testServerConfig())
	const size = 32 << 20
	a, err := s.MallocManaged(size)
	if err != nil {
		b.Fatal(err)
	}
	buf := a.Bytes()
	fill(buf, 1)
	var sum byte
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if err := a.Prefetch(0); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for p := 0; p < size; p += 64 {
			sum += buf[p]
		}
	}
	b.ReportMetric(float64(b.N)*size/b.Elapsed().Seconds()/1e9, "GB/s")
	benchSink += sum
}

// benchSink keeps the compiler from dropping reads whose values nothing
// else uses.
var benchSink byte
