package core

import "math/bits"

const (
	// PageSize is the migration granularity: every managed page is 4 KiB.
	PageSize       = 4096
	PageShift      = 12
	PageOffsetMask = PageSize - 1

	// BlockSize is the unit of residency bookkeeping and locking, the
	// 2 MiB "VA block" of NVIDIA's driver: a fault never looks beyond
	// its block, so one lock covers every decision it makes.
	BlockSize     = 2 << 20
	BlockShift    = 21
	PagesPerBlock = BlockSize / PageSize
	BigPagePages  = 16 // 64 KiB big pages, the granularity NVIDIA assumes for the CPU
	pageMaskWords = PagesPerBlock / 64
)

// PageMask is a set of pages of one block (bit i is page i).
type PageMask [pageMaskWords]uint64

// Set adds page i.
func (m *PageMask) Set(i int) { m[i>>6] |= 1 << (uint(i) & 63) }

// Clear removes page i.
func (m *PageMask) Clear(i int) { m[i>>6] &^= 1 << (uint(i) & 63) }

// Test reports whether page i is in the set.
func (m *PageMask) Test(i int) bool { return m[i>>6]&(1<<(uint(i)&63)) != 0 }

// Count returns the number of pages in the set.
func (m *PageMask) Count() int {
	n := 0
	for _, w := range m {
		n += bits.OnesCount64(w)
	}
	return n
}

// Empty reports whether the set has no pages.
func (m *PageMask) Empty() bool {
	for _, w := range m {
		if w != 0 {
			return false
		}
	}
	return true
}

// CountRange returns the number of pages of [first, outer) in the set.
func (m *PageMask) CountRange(first, outer int) int {
	n := 0
	for first < outer {
		w, lo := first>>6, uint(first)&63
		hi := uint(64)
		if (w+1)*64 > outer {
			hi = uint(outer - w*64)
		}
		word := m[w] >> lo
		if width := hi - lo; width < 64 {
			word &= (1 << width) - 1
		}
		n += bits.OnesCount64(word)
		first = w*64 + int(hi)
	}
	return n
}

// FillRange adds the pages [first, outer).
func (m *PageMask) FillRange(first, outer int) {
	for first < outer {
		w, lo := first>>6, uint(first)&63
		hi := uint(64)
		if (w+1)*64 > outer {
			hi = uint(outer - w*64)
		}
		var bitsToSet uint64 = ^uint64(0)
		if width := hi - lo; width < 64 {
			bitsToSet = (1 << width) - 1
		}
		m[w] |= bitsToSet << lo
		first = w*64 + int(hi)
	}
}

// Or adds every page of o.
func (m *PageMask) Or(o *PageMask) {
	for i := range m {
		m[i] |= o[i]
	}
}

// AndNot removes every page of o.
func (m *PageMask) AndNot(o *PageMask) {
	for i := range m {
		m[i] &^= o[i]
	}
}

// And keeps only pages also in o.
func (m *PageMask) And(o *PageMask) {
	for i := range m {
		m[i] &= o[i]
	}
}

// TrimTo removes pages at or beyond n (a block shorter than 2 MiB).
func (m *PageMask) TrimTo(n int) {
	if n >= PagesPerBlock {
		return
	}
	var keep PageMask
	keep.FillRange(0, n)
	m.And(&keep)
}

// Lowest returns the lowest n pages of m (all of them where m holds
// fewer).
func (m *PageMask) Lowest(n int) PageMask {
	var out PageMask
	for p, k := m.NextSet(0), 0; p >= 0 && k < n; p, k = m.NextSet(p+1), k+1 {
		out.Set(p)
	}
	return out
}

// PagesOverBudget is how many pages must leave a host holding used
// pages to bring it within budget bytes (0 where it is within, or has
// no budget).
func PagesOverBudget(used, budget int64) int64 {
	if budget <= 0 {
		return 0
	}
	return max(used*PageSize-budget+PageSize-1, 0) / PageSize
}

// NextSet returns the first page at or after i in the set, or -1.
func (m *PageMask) NextSet(i int) int {
	for i < PagesPerBlock {
		w := i >> 6
		word := m[w] >> (uint(i) & 63)
		if word != 0 {
			return i + bits.TrailingZeros64(word)
		}
		i = (w + 1) * 64
	}
	return -1
}

// LastSet returns the last page in the set, or -1.
func (m *PageMask) LastSet() int {
	for w := len(m) - 1; w >= 0; w-- {
		if m[w] != 0 {
			return w*64 + 63 - bits.LeadingZeros64(m[w])
		}
	}
	return -1
}

// NextRun returns the first run [first, outer) of consecutive pages in the
// set starting at or after i; first is -1 when there is none. Migration
// works on runs so that each kernel operation covers as many pages as it
// can.
func (m *PageMask) NextRun(i int) (first, outer int) {
	first = m.NextSet(i)
	if first < 0 {
		return -1, -1
	}
	outer = first + 1
	for outer < PagesPerBlock {
		w := outer >> 6
		// Ones of ^m are the pages not in the set; the logical shift
		// fills with zeros, so a nonzero word holds the run's end.
		if word := ^m[w] >> (uint(outer) & 63); word != 0 {
			return first, outer + bits.TrailingZeros64(word)
		}
		outer = (w + 1) * 64
	}
	return first, PagesPerBlock
}
