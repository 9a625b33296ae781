package core

import (
	"fmt"
	"strconv"
	"strings"
)

// Duration is a time.Duration in nanoseconds that JSON can carry.
type Duration int64

// ParseSize parses a byte count: a number with an optional unit, binary
// (KiB, MiB, GiB, TiB, or K, M, G, T) or decimal (KB, MB, GB, TB).
func ParseSize(text string) (int64, error) {
	s := strings.TrimSpace(text)
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := s, ""
	if i >= 0 {
		num, unit = s[:i], strings.TrimSpace(s[i:])
	}
	mult := map[string]float64{
		"": 1, "B": 1,
		"K": 1 << 10, "KiB": 1 << 10, "KB": 1e3,
		"M": 1 << 20, "MiB": 1 << 20, "MB": 1e6,
		"G": 1 << 30, "GiB": 1 << 30, "GB": 1e9,
		"T": 1 << 40, "TiB": 1 << 40, "TB": 1e12,
	}[unit]
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || mult == 0 || v < 0 || v*mult > 1<<62 {
		return 0, fmt.Errorf("%w: size %q: want a number of bytes such as 4096, 64MiB or 2GiB", ErrInvalidValue, text)
	}
	return int64(v * mult), nil
}

// FormatSize renders bytes in the largest binary unit that divides them
// evenly, or with one decimal above a mebibyte.
func FormatSize(n int64) string {
	units := []struct {
		name string
		size int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}
	for _, u := range units {
		if n >= u.size && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + " " + u.name
		}
	}
	for _, u := range units[:3] {
		if n >= u.size {
			return strconv.FormatFloat(float64(n)/float64(u.size), 'f', 1, 64) + " " + u.name
		}
	}
	return strconv.FormatInt(n, 10) + " B"
}
