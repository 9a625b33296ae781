package coursework

import (
	"fmt"

	"github.com/softuvm/softuvm/policy"
)

// Evens brings every even page of the faulted block along with the
// faulted pages: a policy whose effect is easy to see in the statistics.
type Evens struct{}

func init() {
	err := policy.RegisterPrefetchPolicy("evens", func(arg string) (policy.PrefetchPolicy, error) {
		if arg != "" {
			return nil, fmt.Errorf("evens takes no argument, got %q", arg)
		}
		return Evens{}, nil
	})
	if err != nil {
		panic(err) // a name taken twice is a programming error
	}
}

func (Evens) Name() string { return "evens" }

func (Evens) Expand(c *policy.PrefetchContext) (m policy.PageMask) {
	for p := 0; p < c.Pages; p += 2 {
		m.Set(p)
	}
	return m
}
