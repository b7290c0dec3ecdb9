package cli

import (
	"context"
	"errors"
	"strings"

	"github.com/areev/runlease"
)

// parseScope returns the scope that name and limit give, as drivers build
// it: "principal:<p>" is [runlease.PrincipalScope] of p, and any other name
// a [runlease.NamedScope]. It fails with the library's own
// [runlease.ErrInvalidArgument] for a name or limit that ClaimSlots would
// refuse, so that status never shows a scope no driver can claim.
func parseScope(name string, limit int) (runlease.Scope, error) {
	sc := runlease.NamedScope(name, limit)
	if p, ok := strings.CutPrefix(name, "principal:"); ok {
		sc = runlease.PrincipalScope(p, limit)
	}
	// The library checks a scope only inside ClaimSlots, before it touches
	// the store, so a store that fails every call hears about a valid scope
	// and never about an invalid one.
	_, err := runlease.ClaimSlots(context.Background(), refusingStore{}, "scope-check", []runlease.Scope{sc})
	if errors.Is(err, runlease.ErrInvalidArgument) {
		return sc, err
	}
	return sc, nil
}

// errRefused is what every call of a refusingStore returns.
var errRefused = errors.New("scope check: no store")

// refusingStore is a runlease.Store whose every call fails and changes
// nothing.
type refusingStore struct{}

func (refusingStore) MetaGet(context.Context, string) (string, bool, error) {
	return "", false, errRefused
}

func (refusingStore) MetaCAS(context.Context, string, *string, string) (bool, error) {
	return false, errRefused
}

func (refusingStore) MetaDelete(context.Context, string, string) (bool, error) {
	return false, errRefused
}

func (refusingStore) MetaScan(context.Context, string) ([]runlease.Row, error) {
	return nil, errRefused
}
