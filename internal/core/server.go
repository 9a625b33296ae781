package core

import (
	"github.com/softuvm/softuvm/uffd"
)

// RequiredFeatures are the userfaultfd features the server cannot work
// without; wantedFeatures it uses when present.
const (
	RequiredFeatures = uffd.FeatureMissingShmem | uffd.FeatureWPHugetlbfsShmem | uffd.FeatureThreadID
	// Unmap and remove events are not asked for: each makes the client's
	// munmap or madvise wait until a handler reads it, and every ioctl
	// on the userfaultfd fail with EAGAIN meanwhile. Free goes through
	// the control socket instead. Remap events are, so that an mremap of
	// managed memory (unsupported) fails loudly rather than leaving the
	// moved pages unregistered, where holes would fill with zeros.
	WantedFeatures = RequiredFeatures | uffd.FeatureEventRemap | uffd.FeaturePoison |
		uffd.FeatureWPUnpopulated | uffd.FeatureMinorShmem
)
