// Package grade is the graded binary's side of the course kit's grader
// (package course, `uvm lab grade`): Main is what the main package the
// grader writes for a student's file calls, once that file's init
// function has registered its policy, named "student".
//
// Main first calls uvm.Main, because the live run's private fault server
// is a re-execution of the graded binary, which must know the student's
// policy. Then it checks that the policy is registered for the
// assignment's kind, replays it over each trace of the directory it is
// given (package lab), with the assignment's baseline, its reference
// policies and its oracle, every other policy the trace's own, and runs
// it live on a small program of the assignment's (package uvm), once
// with the baseline and once with it, checking the data the program
// wrote; each live run is a child process of the binary, so that a
// policy that crashes its server is reported rather than fatal. It
// prints a table per trace and for the live run, and a final score and
// verdict, or the same as JSON (Report). It exits 0 when it graded,
// whatever the verdict, and 1 when it could not.
//
// It is a package of its own, apart from package course, because it is
// linked into the graded binaries only: it registers the kernel of the
// thrashing assignment's live program, which a uvm command has no use
// for.
package grade
