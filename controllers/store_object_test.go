package controllers

import (
	"reflect"
	"testing"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

func TestAccessProps(t *testing.T) {
	props := map[string]string{"user.x": "1"}
	accessProps(props, "A::OWNER@:rwa", "alice@", "", storagev1.AllowedNamespaces{"team-a", "team-b/trainer"})
	want := map[string]string{"user.x": "1", "acl": "A::OWNER@:rwa", "owner": "alice@",
		storagev1.PropAllowedNamespaces: "team-a,team-b/trainer"}
	if !reflect.DeepEqual(props, want) {
		t.Fatalf("accessProps = %v, want %v", props, want)
	}
	empty := map[string]string{}
	accessProps(empty, "", "", "", nil)
	if len(empty) != 0 {
		t.Fatalf("accessProps of an empty spec = %v, want nothing", empty)
	}
}

func TestPropsToSet(t *testing.T) {
	ns := storagev1.PropAllowedNamespaces
	for _, c := range []struct {
		name          string
		desired, have map[string]string
		want          map[string]string
	}{
		{name: "all in place", desired: map[string]string{"acl": "A::OWNER@:rwa", ns: "a"},
			have: map[string]string{"acl": "A::OWNER@:rwa", ns: "a", "rf": "1"}, want: map[string]string{}},
		{name: "changed and new", desired: map[string]string{"owner": "bob@", ns: "a,b"},
			have: map[string]string{"owner": "alice"}, want: map[string]string{"owner": "bob@", ns: "a,b"}},
		{name: "names without their @", desired: map[string]string{"owner": "alice@", "group": "staff@"},
			have: map[string]string{"owner": "alice", "group": "staff"}, want: map[string]string{}},
		{name: "an ACL in another order", desired: map[string]string{"acl": "A::EVERYONE@:r,A::OWNER@:awr"},
			have: map[string]string{"acl": "A::OWNER@:rwa,A::EVERYONE@:r"}, want: map[string]string{}},
		{name: "another ACL", desired: map[string]string{"acl": "A::OWNER@:rw"},
			have: map[string]string{"acl": "A::OWNER@:rwa"}, want: map[string]string{"acl": "A::OWNER@:rw"}},
		{name: "a restriction the spec no longer has is lifted", desired: map[string]string{},
			have: map[string]string{ns: "team-a"}, want: map[string]string{ns: "*"}},
		{name: "no restriction either side", desired: map[string]string{},
			have: map[string]string{ns: "*"}, want: map[string]string{}},
		{name: "no property either side", desired: map[string]string{}, have: nil, want: map[string]string{}},
	} {
		if got := propsToSet(c.desired, c.have); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: propsToSet = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestPropNames(t *testing.T) {
	if got := propNames(map[string]string{"owner": "", "acl": ""}); got != "properties acl, owner" {
		t.Errorf("got %q", got)
	}
	if got := propNames(map[string]string{"rf": ""}); got != "property rf" {
		t.Errorf("got %q", got)
	}
}
