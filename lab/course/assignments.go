package course

import (
	"fmt"
	"strings"

	"github.com/softuvm/softuvm/policy"
)

// StudentPolicy is the name a student's file registers its policy under,
// whatever the assignment: the grader replays and runs the policy of
// that name.
const StudentPolicy = "student"

// Assignment is one of the kit's assignments: the kind of policy it asks
// for, and what a solution is measured against.
type Assignment struct {
	// Name is what `uvm lab grade` takes, and the assignment's
	// directory under lab/course.
	Name string
	// Kind is the kind of policy (policy.KindPrefetch and the others).
	Kind string
	// Interface and Register are the interface of package policy a
	// solution implements and the function that registers it.
	Interface string
	Register  string
	// Baseline is the policy a solution must beat, as a replay's spec
	// of Kind (lab.Config); References are other policies shown beside
	// it, for scale; Oracle is the replay's bound, "" where the lab has
	// none.
	Baseline   string
	References []string
	Oracle     string
	// Metric says what "beats" means, for the report.
	Metric string
}

// StudentSpec is the replay's and the live server's spec of the
// student's policy.
func (a Assignment) StudentSpec() string {
	if a.Kind == policy.KindThrashing {
		return "policy=" + StudentPolicy
	}
	return StudentPolicy
}

// assignments are the kit's, in the order the README presents them.
var assignments = []Assignment{
	{
		Name: "prefetch", Kind: policy.KindPrefetch,
		Interface: "policy.PrefetchPolicy", Register: "policy.RegisterPrefetchPolicy",
		Baseline: "none", References: []string{"window:16", "density"}, Oracle: "oracle",
		Metric: "estimated time (faults and pages moved, priced by the trace)",
	},
	{
		Name: "eviction", Kind: policy.KindEviction,
		Interface: "policy.Eviction (or policy.PageEviction)", Register: "policy.RegisterEviction",
		Baseline: "lru", References: []string{"2q"}, Oracle: "opt",
		Metric: "estimated time (faults and pages moved, priced by the trace)",
	},
	{
		Name: "thrashing", Kind: policy.KindThrashing,
		Interface: "policy.Thrashing", Register: "policy.RegisterThrashing",
		Baseline: "off", References: []string{"on"},
		Metric: "estimated time (faults, pages moved and naps, priced by the trace)",
	},
}

// Assignments lists the kit's assignments.
func Assignments() []Assignment { return append([]Assignment(nil), assignments...) }

// Names lists the assignments' names.
func Names() []string {
	var out []string
	for _, a := range assignments {
		out = append(out, a.Name)
	}
	return out
}

// Lookup returns the assignment called name, or an error that names the
// known ones.
func Lookup(name string) (Assignment, error) {
	for _, a := range assignments {
		if a.Name == name {
			return a, nil
		}
	}
	return Assignment{}, fmt.Errorf("unknown assignment %q: want one of %s", name, strings.Join(Names(), ", "))
}
