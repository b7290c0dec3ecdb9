package runlease

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// fault classifies an error of pgx. sent is false when the statement never
// left (the connection could not be taken), so nothing can have changed; a
// write that may have reached the server is Unknown unless the server
// answered with an ERROR, which rolls the call's implicit transaction back.
//
// A call whose ctx has ended gives up: its error matches ctx's with
// errors.Is and is never Retryable, whatever the driver made of the end of
// ctx. That matters with pgx's CancelRequestContextWatcherHandler, which
// asks the server to cancel the statement: the server then answers with an
// ERROR (57014, query_canceled), which says the write was rolled back (not
// Unknown) but not that the caller gave up.
func (s *PostgresStore) fault(ctx context.Context, op, key string, write, sent bool, err error) error {
	var pgErr *pgconn.PgError
	isPg := errors.As(err, &pgErr)
	if isPg && (pgErr.Code == "22021" || pgErr.Code == "22P05") {
		// The database's encoding cannot hold the text. CheckKey and
		// CheckValue let only UTF-8 through, so this is a database whose
		// encoding is not UTF-8: the call is refused like any bad argument.
		return fmt.Errorf("%w: %w", invalidArg("text", "the database cannot store it in its encoding"), s.redact(err))
	}
	if !sent && s.closed.Load() {
		return ErrStoreClosed
	}
	cerr := ctx.Err()
	if cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w (%w)", err, cerr) // the end of ctx caused it: keep it matchable
	}
	se := &StorageError{Op: op, Key: key, Err: s.redact(err)}
	switch {
	case isPg && (!sent || !pgFatal(pgErr)):
		se.Retryable = pgRetryable(pgErr.Code)
	case isPg:
		// FATAL or PANIC ends the session; a statement in flight may have
		// committed just before, so a write's outcome is not known.
		se.Unknown = write
		se.Retryable = true
	default:
		se.Unknown = write && sent && !pgconn.SafeToRetry(err)
		se.Retryable = netTransient(err)
	}
	se.Retryable = se.Retryable && cerr == nil
	return se
}

// pgFatal reports whether the server ended the session with the error.
func pgFatal(e *pgconn.PgError) bool {
	sev := e.SeverityUnlocalized
	if sev == "" {
		sev = e.Severity
	}
	return sev == "FATAL" || sev == "PANIC"
}

// pgRetryable reports whether a SQLSTATE names a condition that a retry is
// expected to clear: a serialization failure or deadlock (class 40), a lock
// or statement timeout, a server shutting down or starting up, too few
// resources (class 53) or a connection fault (class 08).
func pgRetryable(code string) bool {
	switch code {
	case "55P03", "57014", "57P01", "57P02", "57P03":
		return true
	}
	switch {
	case strings.HasPrefix(code, "40"), strings.HasPrefix(code, "53"), strings.HasPrefix(code, "08"):
		return true
	}
	return false
}

// netTransient reports whether err is a network fault: a refused, reset or
// timed-out connection, or one that the other side closed.
func netTransient(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, pgconn.ErrConnClosed)
}

// redact keeps the pool's password out of err's text. pgx leaves passwords
// out of its messages; this is a second line of defence, so that no message
// of this package can carry one even if a driver's message quoted the DSN.
func (s *PostgresStore) redact(err error) error {
	if s.secret == "" || !strings.Contains(err.Error(), s.secret) {
		return err
	}
	return &redactedError{err: err, secret: s.secret}
}

type redactedError struct {
	err    error
	secret string
}

func (e *redactedError) Error() string { return strings.ReplaceAll(e.err.Error(), e.secret, "xxxxx") }
func (e *redactedError) Unwrap() error { return e.err }
