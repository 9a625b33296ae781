package bench

// Progress is where a benchmark says what it is doing while it runs: `uvm
// bench` prints each line on standard error, a test logs it. Nil says
// nothing.
type Progress func(format string, a ...any)

// orQuiet is p, or a Progress that says nothing where p is nil.
func (p Progress) orQuiet() Progress {
	if p == nil {
		return func(string, ...any) {}
	}
	return p
}
