//go:build !chaos

package chaos

// fullSize is false without the chaos build tag: CI-sized runs.
const fullSize = false
