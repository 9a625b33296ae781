// Package course is softuvm's course kit: three assignments that ask a
// student to write one policy of package policy each (a prefetcher, an
// eviction policy, a thrashing policy), and the grader that scores a
// student's file, `uvm lab grade ASSIGNMENT FILE.go`.
//
// The assignments are directories beside this file (prefetch/,
// eviction/, thrashing/), each with its README (the interface, its
// contract, what to measure, the baseline to beat and the bound), a
// skeleton to copy (skeleton.go.txt) and, under testdata/, the sample
// solution the tests grade. README.md is the kit's guide.
//
// Grading a file takes a binary of its own, because a policy exists in a
// process only once an init function registered it there, and the
// private fault server a live run starts is a re-execution of the
// program's binary (policy/doc.go, "Where a policy must be registered").
// Grade therefore copies the student's file into a fresh package inside
// the softuvm module (lab/course/_grade/ID/student: the go tool's
// patterns skip directories that start with "_"), writes a main package
// that imports it for its init function and calls grade.Main, builds
// that with the go command, runs it and removes what it made. Package
// grade (lab/course/grade) is the graded binary's side: the replays over
// the shipped traces, the live run and the report.
//
// The kit sits in the top layer of the module's import fence, with the
// commands (internal/lint): it builds on package lab, which replays the
// policies, and on package uvm, which runs them live.
package course
