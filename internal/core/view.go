package core

import (
	"github.com/softuvm/softuvm/uffd"
)

// hostViewMode is how every view registers the managed ranges: MISSING
// for holes in the view's file (first touch, or the page lives
// elsewhere), and WP so that a page being copied away can be held still.
// Pages in the view's file but not mapped are mapped by the kernel on
// touch, which is what prefetch-use tracking relies on.
const HostViewMode = uffd.RegisterMissing | uffd.RegisterWP
