package mgmtpb

import "strings"

// The words of the management enums, as the store's CLI prints them and the operator copies
// them into status: the value's proto name without the enum's prefix, in lower case
// ("MEMBER_STATE_JOINED" -> "joined"); "" for the unspecified value, the number for a value this
// build does not know. (Hand-written beside the generated code; hack/gen-go.sh keeps it.)

func word(name, prefix string) string {
	w, ok := strings.CutPrefix(name, prefix)
	switch {
	case !ok:
		return name
	case w == "UNSPECIFIED":
		return ""
	}
	return strings.ToLower(w)
}

// Word is "joined", "stopped" or "maintenance".
func (s MemberState) Word() string { return word(s.String(), "MEMBER_STATE_") }

// Word is "ready", "maintenance", "degraded" or "unreachable".
func (s StorageState) Word() string { return word(s.String(), "STORAGE_STATE_") }

// Word is "ready", "degraded" or "reintegrating".
func (s PoolState) Word() string { return word(s.String(), "POOL_STATE_") }

// Word is "crc32c" or "off".
func (c Checksum) Word() string { return word(c.String(), "CHECKSUM_") }

// Word is "POSIX": container types are written in capitals.
func (t ContType) Word() string { return strings.ToUpper(word(t.String(), "CONT_TYPE_")) }
