package storetest_test

import (
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/brokenstore"
	"github.com/areev/runlease/internal/systest"
	"github.com/areev/runlease/storetest"
)

// envBrokenStore names the variable that makes TestBrokenStoreSuite run
// the suite against the store broken in the way it names.
const envBrokenStore = "RUNLEASE_STORETEST_BROKEN_STORE"

// caughtBy is, for each broken store, the subtests of the suite that must
// fail against it: the rules its bug breaks.
var caughtBy = map[brokenstore.Bug][]string{
	brokenstore.WriteSkew:        {"batch/batches_conditioned_on_each_others_keys_never_both_apply"},
	brokenstore.IgnoresCancel:    {"cancelled_context/every_method_fails_on_a_cancelled_context_and_changes_nothing"},
	brokenstore.TruncatedScan:    {"scan/a_scan_returns_every_row_of_a_large_prefix"},
	brokenstore.PagingScan:       {"atomic_scan/a_scan_sees_a_row_moved_by_batches_exactly_once", "atomic_scan/a_scan_never_misses_a_row_copied_before_its_old_copy_is_deleted"},
	brokenstore.BareContextError: {"cancelled_context/every_context_error_is_a_StorageError_that_matches_the_context"},
	brokenstore.HandleCache:      {"two_handles/a_write_through_one_handle_is_seen_at_once_by_reads_through_the_other"},
	brokenstore.MislabelledFault: {"fault_labels/a_write_applied_before_a_fault_is_labelled_unknown"},
	brokenstore.ScanManyOnePage:  {"scan_many/large_prefixes_are_returned_whole"},
}

// pagingAtomicScans is how many scans each moving-token test of the suite
// makes against the paging-scan store, which must fail both tests whatever
// the scheduler does; the suite stops at the first scan that catches it,
// most often within a few dozen.
//
// Between each two of its pages that store lets in 1 to 4 writes, drawn at
// random, so the number of writes that land between the page that reads
// the token's first place and the page that reads its other place is even
// or odd at even odds, and each value modulo 4 is as likely as another.
// Moved by batches, the token changes place at every write: a scan sees it
// twice or not at all when that number is odd, in one scan of two, so the
// store escapes the batch test with a chance of 2^-500. Moved by copies,
// the token is, write after write, in the first place, in both, in the
// other place, and in both again: a scan misses it only when it reads the
// first place while the token is in the other place alone and 2 writes
// (modulo 4) land before it reads the other place, in one scan of 16 when
// each scan starts anywhere in that cycle at even odds. A scan starts
// where the one before it ended, moved on by the writes in between, so
// after a miss the share can be lower; but whatever number of writes lands
// between two scans, a run of misses goes on with a chance of at most
// 0.948 a scan, so the store escapes the copy test with a chance below
// 3e-12 (below 1e-14 if scans started anywhere at even odds).
const pagingAtomicScans = 500

// failedSubtest matches the line the testing package prints for a failed
// subtest of TestBrokenStoreSuite, and captures its path below it.
var failedSubtest = regexp.MustCompile(`(?m)^\s*--- FAIL: TestBrokenStoreSuite/(\S+)`)

// TestTheSuiteFailsEveryBrokenStore runs the suite, in a child process, on
// the in-memory store of internal/brokenstore, correct and broken in each
// way in turn: the correct store must pass, and each broken one must fail
// the subtests of the rules its bug breaks. It proves the suite can catch
// those bugs; a change that weakens it fails here.
func TestTheSuiteFailsEveryBrokenStore(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	require.ElementsMatch(t, brokenstore.Bugs, slices.Collect(maps.Keys(caughtBy)), "every broken store needs the subtests that catch it")
	t.Run("the_correct_store_passes", func(t *testing.T) {
		t.Parallel()
		out, err := runSuiteOn(t, brokenstore.None)
		require.NoError(t, err, "the suite failed the correct in-memory store:\n%s", failures(out))
		assert.Empty(t, failedSubtest.FindAllStringSubmatch(out, -1))
	})
	for _, bug := range brokenstore.Bugs {
		t.Run(string(bug), func(t *testing.T) {
			t.Parallel()
			out, err := runSuiteOn(t, bug)
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "the suite passed the %s store, or could not run:\n%s", bug, failures(out))
			var failed []string
			for _, m := range failedSubtest.FindAllStringSubmatch(out, -1) {
				if strings.Contains(m[1], "/") { // a rule, not the group that holds it
					failed = append(failed, m[1])
				}
			}
			for _, want := range caughtBy[bug] {
				assert.Contains(t, failed, want, "the %s store must fail %s; it failed %q", bug, want, failed)
			}
			t.Logf("the %s store failed %d subtests: %s", bug, len(failed), strings.Join(failed, ", "))
		})
	}
}

// runSuiteOn runs TestBrokenStoreSuite on the store with bug in a child
// process, in short mode, and returns its output and how it exited.
func runSuiteOn(t *testing.T, bug brokenstore.Bug) (string, error) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.CommandContext(t.Context(), exe, "-test.run=^TestBrokenStoreSuite$", "-test.short", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envBrokenStore+"="+string(bug))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestBrokenStoreSuite is the child of TestTheSuiteFailsEveryBrokenStore:
// it runs the suite on the store that RUNLEASE_STORETEST_BROKEN_STORE
// names, and skips in an ordinary run.
func TestBrokenStoreSuite(t *testing.T) {
	bug := brokenstore.Bug(os.Getenv(envBrokenStore))
	if bug == "" {
		t.Skip("runs only as the child of TestTheSuiteFailsEveryBrokenStore")
	}
	require.True(t, bug == brokenstore.None || slices.Contains(brokenstore.Bugs, bug), "no broken store %q", bug)
	if bug == brokenstore.PagingScan {
		storetest.SetAtomicScans(t, pagingAtomicScans)
	}
	storetest.RunWith(t, brokenstore.Harness(bug))
}

// failures returns the output of a child without the lines of passing,
// skipped or started tests, at most 200 lines of it.
func failures(out string) string {
	var keep []string
	for line := range strings.Lines(out) {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "=== ") || strings.HasPrefix(trimmed, "--- PASS") || strings.HasPrefix(trimmed, "--- SKIP") {
			continue
		}
		keep = append(keep, line)
	}
	return strings.Join(keep[:min(len(keep), 200)], "")
}
