package uvm

import (
	"fmt"
	"reflect"
	"sync"
)

// Plain types are the element types of typed views of memory (Slice,
// SliceAt) and the types of typed kernel parameters: booleans, integers
// (uintptr included), floating-point and complex numbers, and arrays and
// structs of them. Their values are bytes and nothing else: they can lie
// in memory the Go runtime does not own, and cross to another process.
// A pointer cannot do either. The garbage collector neither scans managed
// memory nor would it find its way back from there, so an object that
// only managed memory points to is freed under it; and a pointer sent
// to a device's process means nothing there. Strings, slices, maps,
// channels, funcs and interfaces hold pointers too.

// pointerPart returns the path, within t, of the first part of t that is
// not plain, and its type; ok is true when t is plain.
func pointerPart(t reflect.Type) (path string, part reflect.Type, ok bool) {
	if v, cached := plainCache.Load(t); cached {
		r := v.(plainResult)
		return r.path, r.part, r.ok
	}
	path, part, ok = findPointer(t, "")
	plainCache.Store(t, plainResult{path, part, ok})
	return path, part, ok
}

type plainResult struct {
	path string
	part reflect.Type
	ok   bool
}

// plainCache remembers pointerPart's answers: SliceAt asks on every call,
// from inside kernels.
var plainCache sync.Map // reflect.Type → plainResult

func findPointer(t reflect.Type, path string) (string, reflect.Type, bool) {
	switch t.Kind() {
	case reflect.Bool,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return "", nil, true
	case reflect.Array:
		// Even a zero-length array of pointers is refused: nothing
		// plain is written that way.
		return findPointer(t.Elem(), path+"[i]")
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if p, part, ok := findPointer(f.Type, path+"."+f.Name); !ok {
				return p, part, false
			}
		}
		return "", nil, true
	}
	return path, t, false
}

// describeNotPlain says which part of t holds a pointer, for messages:
// "*int is a pointer" or "field Name of T is a string".
func describeNotPlain(t reflect.Type, path string, part reflect.Type) string {
	what := kindWords(part)
	if path == "" {
		return fmt.Sprintf("%v is %s", t, what)
	}
	return fmt.Sprintf("%s of %v is %s (%v)", partName(path), t, what, part)
}

// partName names a part of a type by its path from the type: ".A.B" is
// field A.B, "[i].C" element [i].C.
func partName(path string) string {
	if path[0] == '.' {
		return "field " + path[1:]
	}
	return "element " + path
}

func kindWords(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return "a pointer"
	case reflect.UnsafePointer:
		return "an unsafe.Pointer"
	case reflect.String:
		return "a string, which points to its bytes"
	case reflect.Slice:
		return "a slice, which points to its array"
	case reflect.Map:
		return "a map"
	case reflect.Chan:
		return "a channel"
	case reflect.Func:
		return "a func"
	case reflect.Interface:
		return "an interface"
	}
	return "a " + t.Kind().String()
}

// plainRule ends the messages about types that are not plain.
const plainRule = "want bools, integers, uintptr, floating-point and complex numbers, and arrays and structs of them"
