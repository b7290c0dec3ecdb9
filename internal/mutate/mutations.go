package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// mutation is one planted bug: a small edit of one library file, the promise
// it breaks, and the tests expected to catch it.
type mutation struct {
	Name   string // short and unique
	File   string // relative to the module root, with slashes
	Old    string // must occur exactly once in File
	New    string // what replaces it
	Breaks string // the promise the mutated code breaks, in one sentence

	// The tests expected to catch it: the top-level tests (or fuzz
	// targets, whose seed corpus runs as a test) named in Tests, of package
	// Pkg (relative to the module root), with -short when Short, in the
	// environment Env on top of the caller's.
	Pkg      string
	Tests    []string
	Short    bool
	Env      []string
	Postgres bool          // the tests skip without RUNLEASE_TEST_POSTGRES
	Timeout  time.Duration // 0: defaultTimeout

	// Gap, when not empty, says why no test catches the mutation yet: the
	// run reports it as a known gap instead of failing.
	Gap string
}

// apply returns the contents of m.File with m planted, or an error when
// m.Old does not occur exactly once.
func (m mutation) apply(root string) ([]byte, error) {
	src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(m.File)))
	if err != nil {
		return nil, err
	}
	if n := strings.Count(string(src), m.Old); n != 1 {
		return nil, fmt.Errorf("old snippet occurs %d times in %s (want 1): update the catalog", n, m.File)
	}
	return []byte(strings.Replace(string(src), m.Old, m.New, 1)), nil
}

// Run is the -run pattern of m's tests.
func (m mutation) Run() string { return "^(" + strings.Join(m.Tests, "|") + ")$" }

// testCommand is the go test command that runs m's tests, for people to
// copy.
func (m mutation) testCommand() []string {
	cmd := append([]string{}, m.Env...)
	cmd = append(cmd, "go", "test")
	if m.Short {
		cmd = append(cmd, "-short")
	}
	return append(cmd, "-count=1", "-failfast", "-run", "'"+m.Run()+"'", m.Pkg)
}

// simEnv sizes the simulation tests for a mutation run: a fifth of the
// schedules CI runs, which is enough to find each bug below that they find
// at all, in seconds.
var simEnv = []string{"RUNLEASE_SIM_SCHEDULES=2000", "RUNLEASE_DSIM_SCHEDULES=2000"}

// sims are the two simulation tests, for mutations of the lease core.
var sims = []string{"TestSimulation", "TestSimulationModes"}

func with(names []string, more ...string) []string {
	return append(append([]string{}, more...), names...)
}

// The test sets of the catalog's areas.
var (
	leaseTests = []string{"TestLease", "TestLeaseFaultsAreNeverLossesNorLossesSuccesses",
		"TestUnknownOutcomesAreResolvedByReading", "TestFencesNeverGoBackwards", "TestOneWinnerWhenManyDriversRace",
		"TestStalledHolderIsReplacedAndCannotRenew", "TestFencedWrites", "TestFencedWriteWithUnknownOutcome",
		"TestFencedWriteWhoseOutcomeIsUnknownAndLeaseTakenIsNotCalledUnwritten"}
	keeperTests = []string{"TestKeeper", "TestKeeperFaults", "TestKeptSlots", "TestKeeperStopLeavesNoGoroutine",
		"TestALossFoundByACallEndsTheKeepersBeforeItReturns", "TestReleaseStopsTheKeepersFirst",
		"TestKeeperMarginCoversTheStoreClocksUncertainty", "TestKeeperStopsTrustingWhenTheExpiryClockJumpsAhead",
		"TestSlotsTrustedUntil"}
	slotTests = []string{"TestSlots", "TestSlotFaultsAreNeverLosses", "TestKeptSlots", "TestSlotCapHoldsUnderRaces",
		"TestALoweredLimitDrainsAndIsReported", "TestOccupancyListsLiveSlots", "TestAClaimOfUnknownOutcomeIsAFaultNotARefusal"}
	lineageTests = []string{"TestLineageStaleLeaseWhoseReplyCameLateNeverTakesTheNewRow",
		"TestLineageStaleLeaseWhoseReplyCameLateNeverWritesOverTheHolder",
		"TestLineageWinsReturningOutOfLandingOrderDoNotWedgeTheHolder",
		"TestLineageWinsReturningOutOfLandingOrderDoNotEndTheKeeper",
		"TestLineageFailedAcquisitionStampedAsARenewalDoesNotWedgeTheHolder",
		"TestLineageNoOpReentryDoesNotWedgeTheWinner", "TestLineageReentryOfUnknownOutcomeDoesNotWedgeTheNextLease",
		"TestLineageNoOpReentryDoesNotEndTheWinnersKeeper", "TestAnUnknownAcquisitionMatchesOneSentinel"}
	coreTests = with(with(with(leaseTests, keeperTests...), lineageTests...), sims...)
	// lineTests are the admission queue's: its line, places, marks,
	// clocks, legacy entries and Prune of them.
	lineTests = []string{"TestALongLineAdmitsInRankOrder", "TestOverlappingEnqueuesOfOnePrincipalNeverShareATag",
		"TestExpiredEntriesAtTheHeadHoldNobodyBack", "TestAClaimReadsTheHeadOfTheLineOnly",
		"TestAPlainClaimOnAPlainStoreReadsItsRankPastExpiredEntries", "TestFairShareProperties",
		"TestPriorityIsStrictAndTiesGoToTheEarlierRun", "TestAPrincipalsFirstRunIsNotHeldBackByAnothersBacklog",
		"TestJudgeReservesForWaitersAhead", "TestLineKeysSortInRankOrder", "TestQueueKeysRoundTrip",
		"TestWaitersAreAdmittedByFairShareThenInQueueOrder", "TestHigherPriorityIsAdmittedFirst",
		"TestAPlainClaimDoesNotJumpTheQueue", "TestALegacyEntryHoldsNoPlace", "TestALegacyEntryOfTheRunStillWaits",
		"TestASecondWaiterOfOneRunIsRefused", "TestCancelledWaitersOfOnePrincipalLeaveNoMark",
		"TestASecondCallOfAWaitingRunIsRefusedEvenForFewerUnits", "TestAnAdmissionKeepsThePrincipalsMarkWithOrWithoutBatches",
		"TestADeadWaitersPlaceExpires", "TestAStalledWaiterQueuesAgainAtTheBack",
		"TestLeaseClaimSlotsWaitIsFencedByTheLease", "TestPruneRemovesQueueRowsOfGoneWaiters",
		"TestPruneLeavesAQueueEntryItsWaiterRenewed", "TestPruneRemovesOnlyOldFreeRows",
		// queue_place_test.go, queue_fair_test.go
		"TestAWaiterBeyondTheHeadKeepsItsPlaceAndIsNotQueuedTwice", "TestAWaiterWhosePlaceRowAnotherCallTookIsNotAdmitted",
		"TestAnAdmissionWithoutWaitingChecksTheRunsPlaceRow", "TestALeaveWhoseEntryStaysKeepsTheMark",
		"TestANewPlaceIsNotChargedFromBeforeALeftoverBeyondTheHead"}
)

// catalog is every planted bug, in the order they run.
var catalog = []mutation{
	// Slots.
	{
		Name:   "claim-skips-rollback",
		File:   "slots_claim.go",
		Old:    "return nil, errors.Join(err, s.rollback(",
		New:    "return nil, err; _ = errors.Join(err, s.rollback(",
		Breaks: "On a store without batches, a claim refused in a later scope keeps the slots it already wrote in the earlier ones.",
		Pkg:    ".", Tests: with(slotTests, sims...), Env: simEnv,
	},
	{
		Name:   "own-live-slot-reused",
		File:   "queue_scope.go",
		Old:    "if row.Holder == runID {\n\t\t\tst.own++\n\t\t}",
		New:    "if row.Holder == runID {\n\t\t\tst.own++\n\t\t\tst.taken[slot] = takenSlot{&r.Value, true}\n\t\t\tcontinue\n\t\t}",
		Breaks: "A run's own live slot row counts as a free slot, so a second claim of the run writes over a row the first still trusts, and its release lets another run past the limit.",
		Pkg:    ".", Tests: with(slotTests, append([]string{"TestSlotRowsBelongToOneClaim", "TestSlotRowsOfAnEarlierDriverStayItsOwn"}, sims...)...), Env: simEnv,
	},
	{
		Name:   "longer-scope-counted",
		File:   "queue_scope.go",
		Old:    "if !ok || scope != sc.name {\n\t\t\tcontinue // a longer scope name",
		New:    "if !ok || scope[:min(len(scope), len(sc.name))] != sc.name {\n\t\t\tcontinue // a longer scope name",
		Breaks: "Slots of a longer scope name that shares the prefix count against this scope's limit.",
		Pkg:    ".", Tests: slotTests,
	},
	{
		Name:   "slots-above-limit-ignored",
		File:   "queue_scope.go",
		Old:    "\t\tst.used++\n\t\tif slot >= sc.limit {",
		New:    "\t\tif slot < sc.limit {\n\t\t\tst.used++\n\t\t}\n\t\tif slot >= sc.limit {",
		Breaks: "Live slots numbered at or above a lowered limit are not counted, so the scope never drains to the new limit.",
		Pkg:    ".", Tests: slotTests,
	},
	{
		Name:   "slot-fault-drops-slot",
		File:   "slots.go",
		Old:    "if err != nil && !IsOutcomeUnknown(err) {\n\t\t\treturn err\n\t\t}\n\t\tif err == nil && ok {",
		New:    "if err != nil && !IsOutcomeUnknown(err) {\n\t\t\ts.drop(h, ErrTakenOver)\n\t\t\treturn err\n\t\t}\n\t\tif err == nil && ok {",
		Breaks: "A slot whose renewal meets a fault is given up as lost instead of retried within its trust window.",
		Pkg:    ".", Tests: with(slotTests, sims...), Env: simEnv,
	},
	{
		Name:   "slot-adopts-other-claims",
		File:   "slots.go",
		Old:    "return row.Holder == s.runID && row.Fence == s.claimID && slices.Contains(h.doubt, row.UntilMS)",
		New:    "return row.Holder == s.runID",
		Breaks: "A Slots adopts (and Release deletes) a slot row written by another claim of the same run.",
		Pkg:    ".", Tests: with(with(slotTests, sims...), "TestSlotsRowOfAnotherClaimOfTheRunIsNotAdopted"), Env: simEnv,
	},
	{
		Name:   "plain-claim-ahead-of-ties",
		File:   "slots_claim.go",
		Old:    "Units: sc.Units(), EnqMS: math.MaxInt64,",
		New:    "Units: sc.Units(), EnqMS: 0 * math.MaxInt64,",
		Breaks: "A claim that does not wait, tying with a waiter of another principal on priority and fair-share tag, ranks ahead of it and takes the units it reserves.",
		Pkg:    ".", Tests: []string{"TestAPlainClaimRanksBehindAWaiterItTiesWith", "TestAPlainClaimDoesNotJumpTheQueue"},
	},

	// Keepers and the renewer.
	{
		Name:   "loss-keeps-work-context",
		File:   "renewer.go",
		Old:    "if k.cancel != nil {\n\t\tk.cancel(err)\n\t}",
		New:    "if k.cancel != nil && !errors.Is(err, ErrLeaseLost) {\n\t\tk.cancel(err)\n\t}",
		Breaks: "A keeper that loses its lease leaves the run's work context running.",
		Pkg:    ".", Tests: coreTests, Env: simEnv,
	},
	{
		Name:   "strict-slot-loss-ignored",
		File:   "renewer.go",
		Old:    "if broken := k.ks.slots.brokenErr(); broken != nil {\n\t\treturn broken, report\n\t}\n",
		New:    "",
		Breaks: "A slot kept with KeepSlotsStrict is lost without ending the keeper (lost under it, before Keep, or reported to the run's own Renew).",
		// A test waiting for the keeper to end then waits forever.
		Pkg: ".", Tests: with(keeperTests, sims...), Env: simEnv, Timeout: 90 * time.Second,
	},
	{
		Name:   "stale-admission-returned",
		File:   "queue_wait.go",
		Old:    "case err == nil && !w.trusted(held):",
		New:    "case err == nil && false:",
		Breaks: "A waiter whose admission landed, or was confirmed, after its trust window ended returns it as admitted, holding slots that are expiring or gone.",
		Pkg:    ".", Tests: with(sims, "TestAnAdmissionConfirmedAfterItsTrustWindowIsGivenBack"), Env: simEnv,
	},
	{
		Name:   "stalled-waiter-keeps-its-rank",
		File:   "queue_wait.go",
		Old:    "me.Tag = rankIn(states, w.s.runID, me.Principal, me.Priority)\n\tme.EnqMS = max(states[0].nowMS, 1)\n",
		New:    "if me.EnqMS == 0 {\n\t\tme.Tag = rankIn(states, w.s.runID, me.Principal, me.Priority)\n\t\tme.EnqMS = max(states[0].nowMS, 1)\n\t}\n",
		Breaks: "A waiter found stalled past its TTL while the store still shows its entry writes its old fair-share tag and enqueue time again, keeping a place others may have judged expired, ahead of runs that queued meanwhile.",
		Pkg:    ".", Tests: []string{"TestAWaiterFoundStalledWhileItsEntryIsVisibleQueuesAgainAtTheBack",
			"TestAStalledWaiterQueuesAgainAtTheBack", "TestAWaiterStalledPastItsTTLGivesUpAPlaceTheStoreStillShows"},
	},
	{
		Name:   "strict-keeper-unseen-while-slot-renewal-hangs",
		File:   "renewer.go",
		Old:    "\t\tif any {\n\t\t\tnext = earliest(next, trustEnd)\n\t\t}\n",
		New:    "\t\tif any && k.ks.job == nil {\n\t\t\tnext = earliest(next, trustEnd)\n\t\t}\n",
		Breaks: "A keeper whose slot renewal hangs in a store that ignores its context is not looked at when its slots' trust ends, so a strict keeper's work goes on after its slot expired.",
		Pkg:    ".", Tests: with(sims, "TestAStrictKeeperEndsWhenItsSlotsTrustEndsWhileASlotRenewalHangs"), Env: simEnv,
	},
	{
		Name:   "entry-renewals-sent-alone",
		File:   "queue_renew.go",
		Old:    "return m, ok && keyable(s)",
		New:    "return m, ok && false && keyable(s)",
		Breaks: "Each waiter renews its queue entries in a batch of its own, so a process with many waiting runs makes one round trip per waiter per renewal.",
		Pkg:    ".", Tests: []string{"TestAProcesssWaitersRenewTheirEntriesTogether"},
	},
	{
		Name:   "stale-plan-not-prepared-afresh",
		File:   "store_postgres_pin.go",
		Old:    `return strings.Contains(pgErr.Message, "cached plan must not change result type")`,
		New:    `return false && strings.Contains(pgErr.Message, "cached plan must not change result type")`,
		Breaks: "A Postgres connection whose prepared statements' row type changed (the table's value column altered within the documented shape) fails every later call with 0A000 until the pool retires it.",
		Pkg:    ".", Tests: []string{"TestPostgresStatementsPreparedBeforeATableChange"},
	},
	{
		Name:   "renewals-off-beat",
		File:   "renewer.go",
		Old:    "return onBeat(st.trustFrom.Add(k.o.interval), k.o.interval)",
		New:    "return st.trustFrom.Add(k.o.interval)",
		Breaks: "Leases a Renewer keeps come due each at the moment it was acquired plus an interval, so leases acquired a few milliseconds apart never share a batched renewal: one round trip per lease per interval.",
		Pkg:    ".", Tests: []string{"TestRenewerPutsLeasesKeptAtDifferentMomentsInStep"},
	},
	{
		Name:   "acquire-cut-short-keeps-its-row",
		File:   "lease.go",
		Old:    "	if cerr == nil {\n		return fault\n	}\n	l.fence, l.lineage",
		New:    "	if true {\n		return fault\n	}\n	l.fence, l.lineage",
		Breaks: "An acquisition whose context ends while its write's outcome is unknown leaves the row it wrote: the run stays blocked in the holder's name for a TTL though the caller never received the lease.",
		Pkg:    ".", Tests: []string{"TestAcquireWaitContextEndReleasesALandedWrite", "TestAcquireCutShortByItsContextReleasesWhatItWrote"},
	},
	{
		Name:   "sqlite-scan-ignores-its-context",
		File:   "store_sqlite.go",
		Old:    "		if err := ctx.Err(); err != nil {\n			return nil, &StorageError{Op: \"MetaScan\"",
		New:    "		if err := ctx.Err(); false && err != nil {\n			return nil, &StorageError{Op: \"MetaScan\"",
		Breaks: "A SQLite scan, which runs without a watcher on its context, reads every row of its prefix however long ago its context ended.",
		Pkg:    ".", Tests: []string{"TestSQLiteScanEndsBetweenRowsWhenItsContextEnds"},
	},
	{
		Name:   "sqlite-read-wait-ignores-its-context",
		File:   "store_sqlite.go",
		Old:    "	case <-ctx.Done():\n		return nil, &StorageError{Op: op, Key: key, Err: ctx.Err()}\n	}\n}",
		New:    "	}\n}",
		Breaks: "A SQLite read that finds every reading connection taken waits for one however long ago its context ended.",
		Pkg:    ".", Tests: []string{"TestSQLiteReadWaitingForAConnectionEndsWithItsContext"},
		Timeout: 30 * time.Second,
	},
	{
		Name:   "deadline-passed-is-not-the-end",
		File:   "lease.go",
		Old:    "	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {\n		return context.DeadlineExceeded\n	}\n",
		New:    "",
		Breaks: "A store call that returns at the caller's deadline, before the context's timer has run, is judged with the caller still there: AcquireWait and ClaimSlotsWait return a fault instead of the deadline's error, and an acquisition of unknown outcome is not taken back, so the run stays blocked for a TTL in the name of a caller that has gone.",
		Pkg:    ".", Tests: []string{"TestAcquireWaitWhoseDeadlinePassedBeforeItsTimerRan", "TestAWaitWhoseDeadlinePassedBeforeItsTimerRanReturnsTheDeadlinesError"},
	},
	{
		Name:   "wait-queues-past-its-deadline",
		File:   "queue_wait.go",
		Old:    "		if err := ctxEnded(ctx); err != nil {\n			return nil, err\n		}\n		if err := w.keepPlace(",
		New:    "		if err := w.keepPlace(",
		Breaks: "A ClaimSlotsWait that cannot be admitted, whose deadline has passed before its context's timer said so, queues and sleeps instead of returning the deadline's error as AcquireWait does.",
		Pkg:    ".", Tests: []string{"TestAWaitWhoseDeadlinePassedEndsBeforeItQueues"},
	},
	{
		Name:   "pin-sweep-waits-for-the-clock",
		File:   "lineage.go",
		Old:    "now.After(lineages.nextSweep) || now.Before(lineages.nextSweep.Add(-pinSlack))",
		New:    "now.After(lineages.nextSweep)",
		Breaks: "After the clock went back past the last sweep (each synctest bubble's clock starts over), lineages pinned for writes of unknown outcome are kept until the clock catches up, so a long test binary's memory grows with every schedule.",
		Pkg:    ".", Tests: []string{"TestLineagePinsAreSweptAfterTheClockWentBack"},
	},
	{
		Name:   "group-write-without-savepoint",
		File:   "store_sqlite_group.go",
		Old:    "	release := stx.stmt(&stx.release, s.stmts.release)\n",
		New:    "	if true {\n		return false, g.inTx(stx, g)\n	}\n	release := stx.stmt(&stx.release, s.stmts.release)\n",
		Breaks: "A write in a group commit runs without a savepoint of its own: one that fails midway leaves its first statements in the transaction, which commits them with the others, and a failure that rolled the transaction back goes unnoticed.",
		Pkg:    ".", Tests: []string{"TestSQLiteGroupAFailedStatementFailsOnlyItsOwnWrite", "TestSQLiteGroupARollbackInsideAGroupCommitsNothing", "TestSQLiteGroupAFullFileKeepsTheAccounting", "TestSQLiteGroupCommit"},
	},
	{
		Name:   "expiry-reads-not-shared",
		File:   "queue_room.go",
		Old:    "if r.expiryTick != 0 && r.expiryMS >= atMS {",
		New:    "if false && r.expiryTick != 0 && r.expiryMS >= atMS {",
		Breaks: "The waiters of one process woken by one expiry (those nearest the head: up to the limit plus one) each read the scope for themselves, so an expiry costs one read per woken waiter.",
		Pkg:    ".", Tests: []string{"TestAProcesssWaitersShareOneReadPerExpiry"},
	},
	{
		Name:   "renewal-puts-poll-off",
		File:   "queue_wait.go",
		Old:    "\tpollAt := time.Now().Add(jitter(w.s.o.poll))\n\tfor {\n",
		New:    "\tfor {\n\t\tpollAt := time.Now().Add(jitter(w.s.o.poll))\n",
		Breaks: "A waiter that renews its entries before its poll is due starts its poll interval over, so it may look at the scope only a poll interval after each renewal, or never while renewals come sooner.",
		Pkg:    ".", Tests: []string{"TestARenewalDoesNotPutTheNextLookOff"},
	},
	{
		Name:   "renewal-call-cut-at-earliest-end",
		File:   "queue_renew.go",
		Old:    "if r.end.After(end) {",
		New:    "if r.end.Before(end) {",
		Breaks: "A call carrying several waiters' entry renewals is cut at the earliest of their trust ends, so a waiter near its own end makes the others lose their places.",
		Pkg:    ".", Tests: []string{"TestARenewalIsNotCutAtAnotherRenewalsTrustEnd", "TestAShortTTLWaiterDoesNotCutALongTTLWaitersRenewal"},
	},
	{
		Name:   "renewal-confirmed-late-kept",
		File:   "queue_wait.go",
		Old:    "return !slices.Contains(swapped, false) && time.Now().Before(end), nil",
		New:    "return !slices.Contains(swapped, false), nil",
		Breaks: "A waiter keeps a place whose renewal was confirmed only after the entries' trust ended, though others may have seen them expire and moved ahead meanwhile.",
		Pkg:    ".", Tests: []string{"TestARenewalConfirmedAfterItsTrustEndGivesThePlaceUp"},
	},
	{
		Name:   "slot-loss-leaves-strict-keepers-running",
		File:   "slots.go",
		Old:    "\tif i >= 0 {\n\t\ts.endStrict()\n\t}\n",
		New:    "",
		Breaks: "A slot the run's own Renew finds lost leaves its strict keepers running until their next look.",
		Pkg:    ".", Tests: with(keeperTests, sims...), Env: simEnv, Timeout: 90 * time.Second,
	},
	{
		Name:   "trust-ignores-store-clock",
		File:   "keeper.go",
		Old:    "left := time.Duration(st.untilMS-k.lease.o.nowMS())*time.Millisecond - k.o.margin\n\treturn earliest(end, now.Add(left))",
		New:    "return end",
		Breaks: "A keeper trusts its lease by its monotonic clock alone, even when the clock that judges expiry says the row is about to expire.",
		Pkg:    ".", Tests: coreTests, Env: simEnv,
	},
	{
		Name:   "trust-from-renewal-reply",
		File:   "lease_write.go",
		Old:    "if err == nil && ok {\n\t\t\tl.confirm(kind, next, untilMS, start)",
		New:    "if err == nil && ok {\n\t\t\tl.confirm(kind, next, untilMS, start.Add(time.Since(start)))",
		Breaks: "A renewal's trust window starts when its reply came back, not when it was sent, so a keeper whose replies come late trusts its lease past the moment a contender may take it.",
		Pkg:    ".", Tests: with(keeperTests, "TestKeeperTrustStartsWhenTheLastWriteWasSent"),
	},
	{
		Name:   "trust-from-batch-reply",
		File:   "renewer_batch.go",
		Old:    "l.confirm(kindRenew, p.next, p.untilMS, start)",
		New:    "l.confirm(kindRenew, p.next, p.untilMS, start.Add(time.Since(start)))",
		Breaks: "A batched renewal's trust window starts when the batch's reply came back, not when it was sent, so keepers whose replies come late trust their leases past the moment a contender may take them.",
		Pkg:    ".", Tests: with(keeperTests, "TestKeeperTrustStartsWhenTheLastWriteWasSent"),
	},
	{
		Name:   "trust-from-acquisition-reply",
		File:   "lease.go",
		Old:    "l.sentMS, l.trustFrom = fence, lin, row, untilMS, untilMS, start",
		New:    "l.sentMS, l.trustFrom = fence, lin, row, untilMS, untilMS, start.Add(time.Since(start))",
		Breaks: "An acquisition's trust window starts when its reply came back, not when it was sent, so a keeper started on a lease whose acquisition replied late trusts it past the moment a contender may take it.",
		Pkg:    ".", Tests: with(keeperTests, "TestKeeperTrustStartsWhenTheLastWriteWasSent"),
	},
	{
		Name:   "margin-without-uncertainty",
		File:   "keeper.go",
		Old:    "\to.margin += o.uncertainty\n",
		New:    "",
		Breaks: "A keeper's margin leaves out the store clock's uncertainty, so it may trust a lease a contender already sees expired.",
		Pkg:    ".", Tests: with(coreTests, "TestPostgresClockSkew", "TestPostgresPartitionedHolderStopsBeforeAContenderStarts"),
		Env: simEnv,
	},
	{
		Name:   "batch-waits-for-token",
		File:   "renewer_batch.go",
		Old:    "members[i].locked = members[i].k.lease.tryLock()",
		New:    "members[i].locked = members[i].k.lease.lock(context.Background()) == nil",
		Breaks: "A batched renewal waits for the write token of a lease with a write in flight, holding the tokens of the members before it (and, dispatched by the loop, the loop's lock), so a hung write freezes every keeper.",
		Pkg:    ".", Tests: coreTests, Env: simEnv, Timeout: 90 * time.Second,
	},
	{
		Name:   "batch-member-resolved-in-turn",
		File:   "renewer_batch.go",
		Old:    "\t\tif alone != nil && alone[i] {\n\t\t\tr.renewAlone(mb, start)\n\t\t\tcontinue\n\t\t}",
		New:    "\t\tif alone != nil && alone[i] {\n\t\t\tresolve, stop := context.WithDeadline(context.Background(), mb.trustEnd)\n\t\t\terrs[i] = mb.k.lease.renewUnlessRenewed(resolve, mb.observed, r)\n\t\t\tstop()\n\t\t}",
		Breaks: "The members a batch left to renew alone are resolved one after another on the batch's goroutine, before any member's outcome is recorded, so one member's hung read-back or write keeps the others' keepers from renewing until their trust runs out.",
		Pkg:    ".", Tests: []string{"TestRenewerBatchMemberHangs"},
	},
	{
		Name:   "batch-locks-before-its-place",
		File:   "renewer_batch.go",
		Old:    "\tif !placed {\n\t\tif err = r.takeSem(ctx); err == nil {\n\t\t\tlockMembers(members)\n\t\t}\n\t}",
		New:    "\tif !placed {\n\t\tlockMembers(members)\n\t\tif err = r.takeSem(ctx); err != nil {\n\t\t\tfor _, mb := range members {\n\t\t\t\tif mb.locked {\n\t\t\t\t\tmb.k.lease.unlock()\n\t\t\t\t}\n\t\t\t}\n\t\t}\n\t}",
		Breaks: "A batch that finds no place among the renewals in flight takes its leases' write tokens before it waits for one, so a Release or fenced Write of a member waits for other leases' renewals.",
		Pkg:    ".", Tests: []string{"TestRenewerBatchMemberHangs"},
	},
	{
		Name:   "batch-miss-is-loss",
		File:   "renewer_batch.go",
		Old:    "back before the lease finds out why.\n\t\t\talone[i] = true",
		New:    "back before the lease finds out why.\n\t\t\terrs[i] = l.lose(&LeaseLostError{RunID: l.RunID(), Cause: ErrRowChanged})",
		Breaks: "A lease whose write in a batched renewal did not apply is reported lost without reading its row back.",
		Pkg:    ".", Tests: coreTests, Env: simEnv,
	},

	// Leases.
	{
		Name:   "holder-prefix-is-live-owner",
		File:   "lease.go",
		Old:    "if row.live(l.o.nowMS()) && row.Holder != l.holder {",
		New:    "if row.live(l.o.nowMS()) && row.Holder[:min(len(row.Holder), len(l.holder))] != l.holder {",
		Breaks: "A holder re-enters a live lease held by another holder whose string starts with its own.",
		Pkg:    ".", Tests: with(coreTests, "TestHolderStringsNeverCollide", "TestAcquireRefusalSaysTheRunIsHeldNotLost"),
		Env: simEnv,
	},
	{
		Name:   "acquire-read-back-of-own-row-not-a-win",
		File:   "lease.go",
		Old:    "case raw != row:\n\t\t\treturn &raw, false, nil",
		New:    "default:\n\t\t\treturn &raw, false, nil",
		Breaks: "An acquisition whose reply was lost and whose read-back finds the row it sent does not take it: it re-enters over its own row, and a store that loses replies burns a fence per try.",
		Pkg:    ".", Tests: coreTests, Env: simEnv,
	},
	{
		Name:   "lineage-stamp-not-shared",
		File:   "lineage.go",
		Old:    "ms = stampMS(now, ttl, max(floor, prev))",
		New:    "ms = stampMS(now, ttl, floor)",
		Breaks: "Two Leases of one holder and run stamp the same until_ms: after a prune, a stale Lease whose reply came late reads back the new acquisition's row as its own write, and writes over the holder.",
		Pkg:    ".", Tests: coreTests, Env: simEnv,
	},
	{
		Name:   "unstamp-after-an-unknown-outcome",
		File:   "lease.go",
		Old:    "lin.pin(l.o.now(), untilMS) // it may land yet",
		New:    "lin.unstamp(untilMS, prev)",
		Breaks: "An acquisition of unknown outcome hands its stamp back though its row may still land: the next acquisition of the holder sends the same bytes, and one of them takes the other's row for its own.",
		Pkg:    ".", Tests: coreTests, Env: simEnv,
	},
	{
		Name:   "lineage-pin-ignored",
		File:   "lineage.go",
		Old:    "lineages.pins[c] = until",
		New:    "_ = until",
		Breaks: "A lineage whose write's outcome is unknown is dropped with its last Lease value: a new Lease at that fence starts over and may send the very bytes still on their way to the store.",
		Pkg:    ".", Tests: []string{"TestLineageLivesWhileReferencedOrPinned"},
	},
	{
		Name:   "batch-renews-two-leases-of-a-run",
		File:   "renewer_batch.go",
		Old:    "batched[bk] = struct{}{}",
		New:    "_ = bk",
		Breaks: "A Renewer batches two Leases of one run (a re-entry's) into one MetaCASMany, which the store refuses whole: every renewal of the batch fails on a healthy store.",
		Pkg:    ".", Tests: []string{"TestRenewerBatchesOneLeaseOfARun"},
	},
	{
		Name:   "self-unequal-store-accepted",
		File:   "options.go",
		Old:    "return reflect.ValueOf(store).Comparable() && store == store",
		New:    "return reflect.ValueOf(store).Comparable()",
		Breaks: "A Store value holding a NaN float is accepted: it cannot key a map, so its Leases of one holder and fence each get a lineage of their own, and a Renewer's batch lookup misses and keeps the write tokens.",
		Pkg:    ".", Tests: []string{"TestLineageRefusesAStoreValueThatCannotBeCompared"},
	},
	{
		Name:   "released-row-not-remembered",
		File:   "lease_write.go",
		Old:    "rememberReleased(l.store, l.key, tombstone[0])",
		New:    "_ = tombstone",
		Breaks: "A run this process released costs its next Acquire here three round trips (a refused create, a read, the takeover) instead of one.",
		Pkg:    ".", Tests: []string{"TestReacquireAfterReleaseWritesOverTheReleasedRow"},
	},
	{
		Name:   "prune-keeps-the-released-row",
		File:   "admin.go",
		Old:    "forgetReleased(store, r.Key)",
		New:    "_ = r",
		Breaks: "A run pruned here keeps its remembered released row, so its next acquisition makes a refused write and a read before the create that would have done alone.",
		Pkg:    ".", Tests: []string{"TestReacquireAfterReleaseWritesOverTheReleasedRow"},
	},
	{
		Name:   "closed-store-kept-by-the-released-rows",
		File:   "store_sqlite_close.go",
		Old:    "\tForgetStore(s)\n",
		New:    "",
		Breaks: "A SQLite store closed and dropped after a release stays reachable from the memo of released rows, with its database handle, until 1024 later releases push its row out.",
		Pkg:    ".", Tests: []string{"TestTheMemoOfReleasedRowsKeepsNoClosedStore"},
	},
	{
		Name:   "released-rows-list-not-unlinked",
		File:   "tombstones.go",
		Old:    "\ttombstones.order.Remove(e)\n\treturn e\n",
		New:    "\treturn e\n",
		Breaks: "Taking or forgetting a remembered row leaves its element in the order list: every release-then-acquire cycle grows the memo's memory without bound.",
		Pkg:    ".", Tests: []string{"TestTombstonesAreBounded"},
	},
	{
		Name:   "one-scope-claim-gives-up-after-a-lost-race",
		File:   "slots_claim.go",
		Old:    "case errors.As(err, &limit) && try < claimBatchTries-1:",
		New:    "case errors.As(err, &limit) && try < 0:",
		Breaks: "A claim of one scope whose candidate slots were all taken between its scan and its writes reports the scope full, though another slot freed meanwhile.",
		Pkg:    ".", Tests: []string{"TestClaimOfOneScopeScansAgainAfterLosingEveryRace"},
	},
	{
		Name:   "lease-claim-unfenced",
		File:   "slots_claim.go",
		Old:    "if _, ok := l.store.(Batcher); ok && len(scopes) > 0 {",
		New:    "if _, ok := l.store.(Batcher); ok && len(scopes) < 0 {",
		Breaks: "A superseded driver's Lease.ClaimSlots writes over its successor's slot as the run's own; its release then deletes the slot while the successor trusts it, and a third run gets in past the limit.",
		Pkg:    ".", Tests: []string{"TestLeaseClaimSlotsOfASupersededLeaseClaimsNothing"},
	},
	{
		Name:   "lineage-ignores-unwrap",
		File:   "lineage.go",
		Old:    "k := lineageKey{store: storeIdentity(store), key",
		New:    "k := lineageKey{store: store, key",
		Breaks: "A store and a decorator that says it wraps it stamp apart: a Lease acquiring through the store, after a Lease of the same holder through the decorator had its renewal in doubt and its row pruned, sends that renewal's very bytes, and the stale Lease takes the new row for its own and renews over it.",
		Pkg:    ".", Tests: []string{"TestLineageLeasesThroughAWrapperAndItsStoreAreStampedApart"},
	},
	{
		Name:   "own-row-by-holder-and-fence",
		File:   "lease_write.go",
		Old:    "return slices.Contains(l.doubt, row.UntilMS)",
		New:    "return slices.Contains(l.doubt, row.UntilMS) || true",
		Breaks: "A Lease takes any row of its holder at its fence as its own: after a prune, a stale Lease adopts the same holder's new acquisition, and both renew.",
		Pkg:    ".", Tests: coreTests, Env: simEnv,
	},
	{
		Name:   "refused-write-confirmed-by-read-back",
		File:   "lease_write.go",
		Old:    "case found && cur == next && err != nil:",
		New:    "case found && cur == next:",
		Breaks: "A write the store refused is reported as landed when the row read back equals it: another Lease of the holder wrote the same bytes after a prune, and the caller's ops never landed.",
		Pkg:    ".", Tests: coreTests, Env: simEnv,
		Gap: "No schedule reaches it while the rows of one holder and run are stamped apart (lineage.go): a refused write's bytes are never stored by anyone else. " +
			"The guard stays for a holder that two Store values of one database share, which lineage.go documents as not told apart.",
	},
	{
		Name:   "fence-not-raised",
		File:   "lease.go",
		Old:    "fence = row.Fence + 1",
		New:    "fence = row.Fence",
		Breaks: "Taking over or re-entering a lease keeps the old fence, so an older holder's writes are not refused.",
		Pkg:    ".", Tests: leaseTests,
	},
	{
		Name:   "adopt-by-holder-only",
		File:   "lease_write.go",
		Old:    "if row.Holder != l.holder || row.Fence != l.fence {",
		New:    "if row.Holder != l.holder {",
		Breaks: "A lease adopts a row of its holder at another fence (a later re-entry) as its own and writes over it.",
		Pkg:    ".", Tests: coreTests, Env: simEnv,
	},
	{
		Name:   "release-leaves-keepers-running",
		File:   "lease_write.go",
		Old:    "\tfor {\n\t\tl.mu.Lock()\n\t\tkeepers := l.keepers\n\t\tl.keepers = nil\n\t\tif len(keepers) == 0 {\n\t\t\tl.releasing = true\n\t\t}\n\t\tl.mu.Unlock()\n\t\tif len(keepers) == 0 {\n\t\t\tbreak\n\t\t}\n\t\tfor _, k := range keepers {\n\t\t\tk.r.end(k, ErrKeeperStopped)\n\t\t}\n\t}\n",
		New:    "\tl.mu.Lock()\n\tl.releasing = true\n\tl.mu.Unlock()\n",
		Breaks: "Release leaves the lease's keepers running while the release is in flight, instead of stopping them first.",
		Pkg:    ".", Tests: coreTests, Env: simEnv,
	},
	{
		Name:   "loss-not-told-to-keepers",
		File:   "lease_write.go",
		Old:    "\tkeepers := l.keepers\n\tl.keepers = nil\n\tl.mu.Unlock()\n\tif len(keepers) > 0 {\n",
		New:    "\tvar keepers []*Keeper\n\tl.mu.Unlock()\n\tif len(keepers) > 0 {\n",
		Breaks: "A loss found by a call on the lease, such as a fenced Write, does not end its keepers before the call returns.",
		Pkg:    ".", Tests: coreTests, Env: simEnv,
	},
	{
		Name:   "stamp-rounds-down",
		File:   "options.go",
		Old:    "\tif end.After(time.UnixMilli(ms)) {\n\t\tms++\n\t}\n",
		New:    "",
		Breaks: "Rows are stamped with now + TTL rounded down, so a row can expire before the attempt that wrote it is TTL old.",
		Pkg:    ".", Tests: with(coreTests, "TestRowsNeverExpireBeforeTheirAttemptIsTTLOld"), Env: simEnv,
	},
	{
		Name:   "unknown-claim-is-lost-race",
		File:   "options.go",
		Old:    "case unchanged(cur, found):\n\t\treturn false, err",
		New:    "case unchanged(cur, found):\n\t\treturn false, nil",
		Breaks: "A conditional write of unknown outcome that did not land is reported as a lost race, not a fault.",
		Pkg:    ".", Tests: with(slotTests, "TestUnknownOutcomesAreResolvedByReading", "TestForceRelease", "TestSimulation", "TestSimulationModes"),
		Env: simEnv,
	},
	{
		Name:   "row-live-at-its-expiry",
		File:   "row.go",
		Old:    "r.UntilMS > nowMS }",
		New:    "r.UntilMS >= nowMS }",
		Breaks: "A row whose until_ms equals the clock's now still counts as held, so takeover waits a millisecond longer than the reference.",
		Pkg:    ".", Tests: with(with(leaseTests, slotTests...), "TestPeekSaysWhenTakeoverBecomesPossible", "TestRowsNeverExpireBeforeTheirAttemptIsTTLOld"),
	},
	{
		Name:   "acquirewait-wraps-ctx-error",
		File:   "wait.go",
		Old:    "\t\tif err != nil {\n\t\t\tif cerr := ctxEnded(ctx); cerr != nil {\n\t\t\t\treturn nil, cerr\n\t\t\t}\n\t\t}\n",
		New:    "",
		Breaks: "AcquireWait whose context ends during a store call returns a storage error instead of the context's error itself.",
		Pkg:    ".", Tests: []string{"TestAcquireWait", "TestAcquireWaitReturnsTheContextsErrorDuringAStoreCall", "TestAcquireWaitDoesNotSpinOnALeaseCenturiesAway", "TestSimulation", "TestSimulationModes"},
		Env: simEnv,
	},
	{
		Name:   "fenced-write-into-slots",
		File:   "fenced.go",
		Old:    "strings.HasPrefix(key, LeasePrefix) || strings.HasPrefix(key, SlotPrefix)",
		New:    "strings.HasPrefix(key, LeasePrefix)",
		Breaks: "A fenced Write may overwrite slot rows, which are the library's own.",
		Pkg:    ".", Tests: []string{"TestFencedWrites", "TestFencedWriteBadInputWritesNothing"},
	},

	// Holders and rows.
	{
		Name:   "holder-backslash-unescaped",
		File:   "holder.go",
		Old:    "if s[i] == '#' || s[i] == '\\\\' {",
		New:    "if s[i] == '#' {",
		Breaks: "HolderFor leaves a backslash unescaped, so two different (principal, node) pairs can give one holder string.",
		Pkg:    ".", Tests: []string{"TestHolderStringsNeverCollide", "TestParseHolderRefusesForeignStrings", "TestHolderPropertyRejectsNaiveHolders", "FuzzHolderFor"},
	},
	{
		Name:   "node-id-without-nonce",
		File:   "holder.go",
		Old:    `return host + "/" + strconv.Itoa(getpid()) + "/" + processNonce()`,
		New:    `return host + "/" + strconv.Itoa(getpid())`,
		Breaks: "DefaultNodeID is only host and pid, which two containers of one pod share.",
		Pkg:    ".", Tests: []string{"TestDefaultNodeID", "TestDefaultNodeIDDiffersBetweenContainersOfOnePod", "TestHolderPropertyRejectsNaiveHolders"},
	},
	{
		Name:   "row-duplicate-field",
		File:   "row_decode.go",
		Old:    "\t\tif seen[field] {\n\t\t\treturn p.errorf(\"duplicate field %s\", rowFields[field])\n\t\t}\n",
		New:    "",
		Breaks: "The row decoder accepts a known field given twice, which the reference refuses as corrupt.",
		Pkg:    ".", Tests: []string{"TestRowDecodingFollowsSerde", "TestReferenceDecoderFollowsSerde", "TestRowsWrittenByTheReferenceAreRead", "TestCorruptLeaseRowIsRefusedAndKept", "FuzzRowCodec", "FuzzRowDecode"},
	},

	// Stores.
	{
		Name:   "sqlite-cas-ignores-expected",
		File:   "store_sqlite.go",
		Old:    "`UPDATE runlease_meta SET value = ? WHERE key = ? AND value = ?`",
		New:    "`UPDATE runlease_meta SET value = ? WHERE key = ? AND ? IS NOT NULL`",
		Breaks: "The SQLite store's MetaCAS writes over any existing row, whatever the expected value.",
		Pkg:    ".", Tests: []string{"TestSQLiteConformance"}, Short: true,
	},
	{
		Name:   "sqlite-scan-like",
		File:   "store_sqlite.go",
		Old:    "`SELECT key, value FROM runlease_meta WHERE key >= ? AND key < ? ORDER BY key`",
		New:    "`SELECT key, value FROM runlease_meta WHERE key LIKE ? || '%' AND key < ? ORDER BY key`",
		Breaks: "The SQLite store's MetaScan matches its prefix with an unescaped LIKE, so '%', '_' and letter case in a prefix match other keys.",
		Pkg:    ".", Tests: []string{"TestSQLiteConformance"}, Short: true,
	},
	{
		Name:   "postgres-cas-ignores-expected",
		File:   "store_postgres.go",
		Old:    "`UPDATE %s SET value = $3 WHERE key = $1 AND value = $2 RETURNING `",
		New:    "`UPDATE %s SET value = $3 WHERE key = $1 AND $2::text IS NOT NULL RETURNING `",
		Breaks: "The Postgres store's MetaCAS writes over any existing row, whatever the expected value.",
		Pkg:    ".", Tests: []string{"TestPostgresConformance"}, Short: true, Postgres: true,
	},
	{
		Name:   "postgres-scan-like",
		File:   "store_postgres.go",
		Old:    "`SELECT key, value FROM %s WHERE key >= $1 AND key < $2 ORDER BY key`",
		New:    "`SELECT key, value FROM %s WHERE key LIKE $1 || '%%' AND key < $2 ORDER BY key`",
		Breaks: "The Postgres store's MetaScan matches its prefix with an unescaped LIKE, so '%' and '_' in a prefix match other keys.",
		Pkg:    ".", Tests: []string{"TestPostgresConformance"}, Short: true, Postgres: true,
	},
	{
		Name:   "postgres-notify-wrong-key",
		File:   "store_postgres_notify.go",
		Old:    "s.channel, pgPayload(key, value)}",
		New:    "s.channel, pgPayload(value, value)}",
		Breaks: "A Postgres release wakes the waiters of a key named by the new row instead of the released key's, so waiters only poll.",
		Pkg:    ".", Tests: []string{"TestPostgresNotifications", "TestAcquireWait"}, Postgres: true,
	},
	{
		Name:   "postgres-new-mark-wakes-nobody",
		File:   "store_postgres_waiters.go",
		Old:    "for _, key := range fresh { // a refreshed mark has nothing new to tell\n\t\t\ts.listen.subs.Wake(key, \"\")",
		New:    "for _, key := range fresh { // a refreshed mark has nothing new to tell\n\t\t\t_ = key",
		Breaks: "A new Postgres wait mark does not wake its key's subscribers, so a release that committed before the mark, and notified nobody, is found only by the next poll.",
		Pkg:    ".", Tests: []string{"TestPostgresANewMarkWakesItsSubscribers"}, Postgres: true,
	},
	{
		Name:   "postgres-marks-never-written",
		File:   "store_postgres_waiters.go",
		Old:    "if len(put) > 0 && s.putMarks(",
		New:    "if false && s.putMarks(",
		Breaks: "A Postgres store never marks the keys its subscribers wait on, so no release notifies them and waiters only poll.",
		Pkg:    ".", Tests: []string{"TestPostgresNotifications"}, Postgres: true,
	},
	{
		// The tests start a primary and a synchronous standby of their
		// own from the local PostgreSQL installation; like the other
		// Postgres mutations, a run without a Postgres server skips them.
		Name:   "postgres-cut-wait-is-landed",
		File:   "store_postgres.go",
		Old:    "if cerr := ctx.Err(); err == nil && write && cerr != nil {",
		New:    "if cerr := ctx.Err(); false && err == nil && write && cerr != nil {",
		Breaks: "A Postgres write whose context ended before its reply was read is reported as landed when the server answered that it committed, though that answer may be of a commit whose wait for the synchronous standby the context's end cancelled: after a failover the write is gone.",
		Pkg:    ".", Tests: []string{"TestPostgresCancelledWaitForTheStandby"}, Postgres: true,
	},
	{
		Name:   "postgres-doubt-read-without-barrier",
		File:   "store_postgres.go",
		Old:    "if s.doubts.has(key) {\n\t\treturn s.getDurable(ctx, key)",
		New:    "if false && s.doubts.has(key) {\n\t\treturn s.getDurable(ctx, key)",
		Breaks: "The read-back that resolves a Postgres write of unknown outcome reads the primary without waiting for the synchronous standby, so a commit whose wait was cut short is found there and reported as landed, though a failover loses it.",
		Pkg:    ".", Tests: []string{"TestPostgresCancelledWaitForTheStandby"}, Postgres: true,
	},
	{
		Name:   "slot-trust-from-claim-reply",
		File:   "slots_claim.go",
		Old:    "h := &heldSlot{scope: sc.name, slot: c.slot, key: key, seen: row,\n\t\t\t\tuntilMS: untilMS, sentMS: untilMS, lin: lin, trustFrom: start, prev: c.expected}",
		New:    "h := &heldSlot{scope: sc.name, slot: c.slot, key: key, seen: row,\n\t\t\t\tuntilMS: untilMS, sentMS: untilMS, lin: lin, trustFrom: start.Add(time.Since(start)), prev: c.expected}",
		Breaks: "A slot claimed by a conditional write of its own (one scope, or a store without batches) is trusted from the claim's reply, not its send, so a run whose replies come late trusts the slot past the moment another run may take it.",
		Pkg:    ".", Tests: with(slotTests, "TestSlotTrustStartsWhenTheLastWriteWasSent"),
	},
	{
		Name:   "slot-trust-from-batch-claim-reply",
		File:   "slots_claim.go",
		Old:    "case ok:\n\t\t\ts.held = held\n",
		New:    "case ok:\n\t\t\tfor _, h := range held {\n\t\t\t\th.trustFrom = h.trustFrom.Add(time.Since(h.trustFrom))\n\t\t\t}\n\t\t\ts.held = held\n",
		Breaks: "The slots of a claim written in one batch are trusted from the batch's reply, not its send, so a run whose replies come late trusts them past the moment another run may take them.",
		Pkg:    ".", Tests: with(slotTests, "TestSlotTrustStartsWhenTheLastWriteWasSent"),
	},
	{
		Name:   "slot-trust-from-fenced-claim-reply",
		File:   "slots_claim.go",
		Old:    "case err == nil:\n\t\t\ts.held = held\n",
		New:    "case err == nil:\n\t\t\tfor _, h := range held {\n\t\t\t\th.trustFrom = h.trustFrom.Add(time.Since(h.trustFrom))\n\t\t\t}\n\t\t\ts.held = held\n",
		Breaks: "The slots of a claim fenced by its lease are trusted from the batch's reply, not its send, so a run whose replies come late trusts them past the moment another run may take them.",
		Pkg:    ".", Tests: with(slotTests, "TestSlotTrustStartsWhenTheLastWriteWasSent"),
	},
	{
		Name:   "slot-trust-from-admission-reply",
		File:   "queue_wait.go",
		Old:    "\ts.held = held\n\treturn s, nil\n",
		New:    "\tfor _, h := range held {\n\t\th.trustFrom = h.trustFrom.Add(time.Since(h.trustFrom))\n\t}\n\ts.held = held\n\treturn s, nil\n",
		Breaks: "The slots of a claim admitted from the queue are trusted from the admission's reply, not its send, so a run whose replies come late trusts them past the moment another run may take them.",
		Pkg:    ".", Tests: with(slotTests, "TestSlotTrustStartsWhenTheLastWriteWasSent"),
	},
	{
		Name:   "slot-trust-from-renewal-reply",
		File:   "slots.go",
		Old:    "if err == nil && ok {\n\t\t\ts.confirm(h, next, untilMS, start)",
		New:    "if err == nil && ok {\n\t\t\ts.confirm(h, next, untilMS, start.Add(time.Since(start)))",
		Breaks: "A slot renewal's trust window starts when its reply came back, not when it was sent, so Slots.TrustedUntil and a KeepSlotsStrict keeper trust the slot past the moment another run may take it.",
		Pkg:    ".", Tests: with(keeperTests, "TestSlotTrustStartsWhenTheLastWriteWasSent"),
	},
	// The line (queue_line.go, queue_scope.go, queue.go, queue_wait.go):
	// the admission queue's rows at keys in rank order.
	{
		Name:   "mark-written-unconditioned",
		File:   "queue_wait.go",
		Old:    "conds, ops = append(conds, Cond{Key: mk, Value: seen}), append(ops, Put(mk, marks[i]))",
		New:    "ops = append(ops, Put(mk, marks[i]))",
		Breaks: "A new place (or an admission without waiting) moves its principal's mark without checking the mark it read, so two overlapping enqueues of one principal through two Store values (a process's own waiters of a principal take turns) take the same fair-share tag and the principal gets two runs for one share.",
		Pkg:    ".", Tests: with(lineTests, "TestEnqueuesOfOnePrincipalThroughTwoStoresNeverShareATag"),
	},
	{
		Name:   "head-not-read-past-expired",
		File:   "queue_line.go",
		Old:    "for r.cut && liveEntries(sc.name, r.head, nowMS, \"\") < headDepth(sc) {",
		New:    "for false && r.cut && liveEntries(sc.name, r.head, nowMS, \"\") < headDepth(sc) {",
		Breaks: "A head whose first rows are expired entries is judged as read: the live waiters behind them are never seen, and a claim is admitted over them.",
		Pkg:    ".", Tests: lineTests,
	},
	{
		Name:   "cut-head-holds-nothing-beyond",
		File:   "queue_wait.go",
		Old:    "\treturn st.cut && key > st.headLast\n}",
		New:    "\treturn false\n}",
		Breaks: "A waiter whose entry lies beyond the head read (the line is longer than the limit+1 first live entries) takes the head for the whole line, finds its place gone and queues again at the back, again and again: it is never admitted.",
		Pkg:    ".", Tests: lineTests,
	},
	{
		Name:   "place-beyond-head-unseen",
		File:   "queue_wait.go",
		Old:    "if !st.cut || p.Key <= st.headLast {\n\t\treturn nil, \"\", nil // within the head",
		New:    "if true {\n\t\treturn nil, \"\", nil // within the head",
		Breaks: "A second call for a run whose first call waits beyond the head of the line is not refused with RUN-E026: the place row's entry is taken as gone, and the run waits twice.",
		Pkg:    ".", Tests: lineTests,
	},
	{
		Name:   "plain-admission-place-unconditioned",
		File:   "queue_wait.go",
		Old:    "\t\t\t} else {\n\t\t\t\tconds = append(conds, Cond{Key: pk})\n\t\t\t}",
		New:    "\t\t\t}",
		Breaks: "A run admitted without waiting does not check that no other call of the run took a place since its read, so it is admitted inside that call's reservation.",
		Pkg:    ".", Tests: lineTests,
	},
	{
		Name:   "queued-admission-place-unconditioned",
		File:   "queue_wait.go",
		Old:    "conds = append(conds, Cond{Key: w.keys[i], Value: &w.rows[i]}, Cond{Key: pk, Value: &w.places[i]})",
		New:    "conds = append(conds, Cond{Key: w.keys[i], Value: &w.rows[i]})",
		Breaks: "A queued waiter's admission does not check its place row, so a waiter whose place a newer call of the run took is still admitted.",
		Pkg:    ".", Tests: lineTests,
	},
	{
		Name:   "legacy-entry-not-checked",
		File:   "queue_wait.go",
		Old:    "if e := st.legacy; e != nil && e.Waiter != w.me.Waiter && e.Fence >= w.fence {",
		New:    "if e := st.legacy; false && e != nil && e.Waiter != w.me.Waiter && e.Fence >= w.fence {",
		Breaks: "A run that an earlier runlease version still has waiting (a live legacy entry) is queued a second time by this version instead of refused with RUN-E026.",
		Pkg:    ".", Tests: lineTests,
	},
	{
		Name:   "leave-gives-share-back-though-entry-stays",
		File:   "queue_wait.go",
		Old:    "if gone && !inherited && !(landed && w.giveShareBack(",
		New:    "if true && !inherited && !(landed && w.giveShareBack(",
		Breaks: "A waiter that leaves moves its principal's mark back though its entry could not be deleted, so the principal's next run takes the tag the leftover entry still ranks at.",
		Pkg:    ".", Tests: lineTests,
	},
	{
		Name:   "older-waiter-gives-back-an-inherited-share",
		File:   "queue_wait.go",
		Old:    "inherited = w.sameShare(ctx, sc.name, p.Key)",
		New:    "inherited = false",
		Breaks: "An older driver's waiter displaced by a newer one that kept its rank gives back the share the newer one took over, when both marks were stamped in one millisecond: the principal's next run shares the newer waiter's tag.",
		Pkg:    ".", Tests: []string{"TestAnOlderWaiterLeavesTheNewerDriverItsShare"},
	},
	{
		Name:   "postgres-listener-stops-at-once",
		File:   "store_postgres_notify.go",
		Old:    "const pgListenLinger = 2 * time.Second",
		New:    "const pgListenLinger = time.Millisecond",
		Breaks: "A driver that waits at every superstep opens a listening connection and writes and deletes its scope's mark at every call: the pool opens a new server process each time.",
		Pkg:    ".", Tests: []string{"TestASubscriptionBackWithinTheLingerFindsTheListenerAndTheMark"}, Postgres: true,
	},
	{
		Name:   "postgres-close-skips-a-lingering-stop",
		File:   "store_postgres_notify.go",
		Old:    "\t\ts.listen.running.Wait()",
		New:    "\t\t_ = 0",
		Breaks: "Close returns while a listener its linger's timer stopped still runs, using the pool the caller may close next.",
		Pkg:    ".", Tests: []string{"TestCloseWaitsForTheListenerItsLingerIsStopping"}, Postgres: true,
	},
	{
		Name:   "claim-clean-up-gives-up-at-first-fault",
		File:   "queue_wait.go",
		Old:    "return errors.As(err, &se) && (se.Retryable || se.Unknown) && ctx.Err() == nil",
		New:    "return false && errors.As(err, &se) && (se.Retryable || se.Unknown) && ctx.Err() == nil",
		Breaks: "The clean-up of an admission in doubt leaves the admitted slots live until their TTL after one store fault.",
		Pkg:    ".", Tests: []string{"TestAKeeperEndingAtAnyMomentOfItsClaimSlotsWaitLeavesNoSlot"},
	},
	{
		Name:   "inherited-share-kept-for-another-principal",
		File:   "queue_wait.go",
		Old:    "inherited = w.sameShare(ctx, sc.name, p.Key)",
		New:    "inherited = true",
		Breaks: "An older driver's waiter keeps its principal charged when a newer waiter of another principal, ranked anew, landed at its very line key.",
		Pkg:    ".", Tests: []string{"TestAnOlderWaiterGivesBackItsShareWhenTheNewerOneRanksAnew"},
	},
	{
		Name:   "rebase-ignores-leftover-beyond-head",
		File:   "queue_wait.go",
		Old:    "return w.marks[i] != \"\" && raw == w.marks[i] && !(st.cut && w.keys[i] > st.headLast)",
		New:    "return w.marks[i] != \"\" && raw == w.marks[i]",
		Breaks: "A waiter that lost its place charges its new place from the mark before the lost one even when the lost entry is still in the line beyond the head read, so its new place takes the tag of its own leftover.",
		Pkg:    ".", Tests: lineTests,
	},
	{
		Name:   "clock-never-written",
		File:   "queue_wait.go",
		Old:    "if fin := e.finish(); fin > st.clock {",
		New:    "if fin := e.finish(); false && fin > st.clock {",
		Breaks: "An admission never moves its scope's clock, so a principal that queues when nothing waits starts at virtual time 0, ahead of every share spent before, and takes turn after turn from a principal that queued all along.",
		Pkg:    ".", Tests: lineTests,
	},
	{
		Name:   "prune-place-of-live-entry",
		File:   "admin.go",
		Old:    "return !u.live[p.Key]",
		New:    "return p.Key != \"\" || !u.live[p.Key]",
		Breaks: "Prune deletes the place row of a run that still waits (the place's until_ms is not renewed with the entry), so a second call of that run is no longer refused with RUN-E026.",
		Pkg:    ".", Tests: lineTests,
	},
	{
		Name:   "prune-mark-ahead-of-live-tag",
		File:   "admin.go",
		Old:    "t, waiting := u.minTag[scope]\n\t\treturn ok",
		New:    "t, waiting := u.minTag[scope]\n\t\treturn ok || true\n\t\treturn ok",
		Breaks: "Prune deletes a principal's mark that is ahead of a live entry's tag, so the principal's next run starts at the virtual time again, ahead of its own runs still waiting.",
		Pkg:    ".", Tests: lineTests,
	},
	{
		Name:   "line-priority-not-inverted",
		File:   "queue_line.go",
		Old:    "b = appendPadded(b, uint64(MaxPriority-e.Priority), rankPriorityDigits)",
		New:    "b = appendPadded(b, uint64(MaxPriority+e.Priority), rankPriorityDigits)",
		Breaks: "Line keys sort lower priorities first, so the head read holds the lowest-priority waiters and a higher-priority waiter is held back by them.",
		Pkg:    ".", Tests: lineTests,
	},
	{
		Name:   "sqlite-range-includes-after",
		File:   "store_sqlite_range.go",
		Old:    "st = s.stmts.ranges.after\n",
		New:    "st = s.stmts.ranges.from\n",
		Breaks: "A SQLite range read on past a key returns that key again, so a head read in pages counts the last entry of a page twice.",
		Pkg:    ".", Tests: with(lineTests, "TestReadRanges", "TestSQLiteRangesUnderWrites"),
	},
	{
		Name:   "postgres-range-includes-after",
		File:   "store_postgres_range.go",
		Old:    "pgRange     = `SELECT key, value FROM %s WHERE key > $1",
		New:    "pgRange     = `SELECT key, value FROM %s WHERE key >= $1",
		Breaks: "A Postgres range read on past a key returns that key again, so a head read in pages counts the last entry of a page twice.",
		Pkg:    ".", Tests: with(lineTests, "TestPostgresRangesReadOnlyTheHead", "TestPostgresConformance"), Postgres: true,
	},
}
