package v1alpha1

import (
	"fmt"
	"strconv"
	"strings"
)

// Bytes parses the size the way the engines do (binary units: K=1024), in the store's spellings
// (4GiB, 4G) and in Kubernetes' (4Gi).
func (s Size) Bytes() (uint64, error) {
	t := strings.TrimSpace(string(s))
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(t)
	}
	num, unit := t[:i], strings.ToLower(t[i:])
	var shift uint
	switch unit {
	case "", "b":
	case "k", "kb", "ki", "kib":
		shift = 10
	case "m", "mb", "mi", "mib":
		shift = 20
	case "g", "gb", "gi", "gib":
		shift = 30
	case "t", "tb", "ti", "tib":
		shift = 40
	default:
		return 0, fmt.Errorf("size %q: unknown unit %q (use K/Ki/KiB, M/Mi/MiB, G/Gi/GiB, T/Ti/TiB)", string(s), unit)
	}
	n, err := strconv.ParseFloat(num, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: expected a number with an optional unit", string(s))
	}
	return uint64(n * float64(uint64(1)<<shift)), nil
}
