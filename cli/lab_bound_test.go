package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLabBoundFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--budget", "0%", "--", "true"}, `--budget "0%"`},
		{[]string{"--budget", "lots", "--", "true"}, `--budget "lots"`},
		{[]string{"--granule", "6KiB", "--", "true"}, `--granule "6KiB"`},
		{[]string{"--fault-cost", "-1us", "--", "true"}, "--fault-cost -1µs"},
		{[]string{"--allocator", "tcmalloc", "--", "true"}, `--allocator "tcmalloc"`},
	} {
		assert.ErrorContains(t, runLabBound(c.args), c.want, "%v", c.args)
	}
	assert.ErrorIs(t, runLabBound(nil), errUsage)
}
