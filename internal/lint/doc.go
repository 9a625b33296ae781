// Package lint holds checks on the repository itself that run with the
// tests: the import fence that keeps raw system calls in the packages
// that own the kernel boundary.
package lint
