package statuspage_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/areev/runlease"
	"github.com/areev/runlease/statuspage"
)

// An application mounts the page on its admin server, below a path of its
// choosing; here a test server stands in for it.
func ExampleNew() {
	ctx := context.Background()
	store, err := runlease.Open(ctx, "sqlite::memory:")
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if _, err := runlease.Acquire(ctx, store, "nightly-42", "worker-1"); err != nil {
		panic(err)
	}

	mux := http.NewServeMux()
	mux.Handle("/runlease/", http.StripPrefix("/runlease", statuspage.New(store,
		statuspage.WithName("sqlite::memory:"), statuspage.WithLimits(map[string]int{"mem": 64}))))
	admin := httptest.NewServer(mux)
	defer admin.Close()

	resp, err := http.Get(admin.URL + "/runlease/status.json?state=live")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	var page statuspage.Page
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		panic(err)
	}
	for _, l := range page.Leases {
		fmt.Println(l.RunID, l.State, l.Holder, "fence", l.Fence)
	}
	fmt.Println("scopes:", page.Scopes[0].Scope, page.Scopes[0].Used, "of", *page.Scopes[0].Limit)
	// Output:
	// nightly-42 live worker-1 fence 1
	// scopes: mem 0 of 64
}
