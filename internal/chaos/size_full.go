//go:build chaos

package chaos

// fullSize is true with the chaos build tag: full-sized runs.
const fullSize = true
