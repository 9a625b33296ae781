package policy

import "strconv"

// WindowPrefetch brings the Pages pages that follow each faulted page,
// within its block: the sequential read-ahead of a page cache.
type WindowPrefetch struct{ Pages int }

func (w WindowPrefetch) Name() string { return "window:" + strconv.Itoa(w.Pages) }

func (w WindowPrefetch) Expand(c *PrefetchContext) (m PageMask) {
	for p := c.Faulted.NextSet(0); p >= 0; p = c.Faulted.NextSet(p + 1) {
		m.FillRange(p+1, min(p+1+w.Pages, c.Pages))
	}
	return m
}
