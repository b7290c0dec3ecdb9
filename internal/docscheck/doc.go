// Package docscheck holds the checks of the repository's documentation:
// every promise listed in docs/promises.txt is written exactly once across
// README.md and docs/*.md, every error code has one row in docs/errors.md,
// and every relative link resolves. It has no code of its own.
package docscheck
