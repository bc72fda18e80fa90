/* Who is charged for a crash: the rule of requeue_lapsed (witness, suspect,
   isolated, bystander, parent), child_died, the job-of-death cap, and the
   fenced fail and release, as a Promela model for SPIN
   (tests/unit/test_model.py).

   2 workers (2 slots each) x 3 jobs x 2 reapers, exhaustively. Job 0 is
   poison: its handler kills the process running it (the worker, or with
   -DPOOL_PROCESS only its child). Jobs 1 and 2 are healthy: each may fail
   once (a retry) and may be released once (a drain or a hand-off), then
   completes. Besides the poison, one SIGKILL from outside may hit any worker
   at any step. A dead worker's session ends; a reaper cuts its leases
   (workers_vanished), they lapse, and a reaper requeues them with a verdict;
   the worker comes back as a new process once its jobs are requeued. Freezes
   are lease.pml's; here every lease lapses with its worker's death.

   A requeue statement judges every lapsed job of a worker in one snapshot
   (held: the worker's active jobs). Reapers race: each statement is atomic,
   as FOR UPDATE SKIP LOCKED with one snapshot per statement makes it. (A
   worker with more lapsed jobs than one statement's batch, 500, could have
   its last ones judged alone: not modelled.)

   Checked:
   - evidence: every stall charged to a job is backed by a crash it alone
     could have caused: it was its worker's only job or its isolated one (a
     death of the worker, thread pool), or its own child died (process pool);
     a parent's death in process mode is evidence against nobody;
   - a job of death has max_stalls + 1 such crashes; a healthy job isolated
     as a suspect pays for a neighbour's crashes twice at most (the neighbour
     is noted as present, and a suspect itself at its second); so with
     max_stalls 3 (-DMAX_STALLS=3) no healthy job is ever failed as a job of
     death by one outside SIGKILL and a poison neighbour;
   - the fenced writes (complete, fail, release, child_died) land only for the
     owner of the current token;
   - every run ends with the poison job failed and the others completed (any
     other end state is an invalid one: a job lost or left waiting).

   Mutations (-D...), each of which must produce a counterexample:
   CHARGE_ALL      every job of a dead worker charged (no witness rule);
   BYSTANDER       the other jobs of a worker isolating a suspect charged too;
   PARENT_CHARGES  with -DPOOL_PROCESS, a parent's death judged as a thread
                   worker's (its lone job charged). */

#define W 2
#define J 3
#define CAP 2
#define POISON 0
/* 1 in CI (every property but the last below); -DMAX_STALLS=3, the default
   of a queue, also checks that no healthy job is failed as a job of death
   (28 M states, ~50 s, 2.5 GB: bench/README.md). */
#ifndef MAX_STALLS
#define MAX_STALLS 1
#endif
#define MAX_HANDOFFS 1
#define NONE 255

mtype = { QUEUED, ACTIVE, DONE, FAILED };

mtype status[J];
byte owner[J];           /* worker of the latest claim */
byte stalls[J];
byte witnessed[J];       /* suspect_stalls */
bool suspect[J];
bool isolated[J];
byte handoffs[J];
byte evidence[J];        /* crashes that point at it: alone, isolated, or its child */
byte beside[J];          /* of those, crashes while it ran isolated beside others */

bool alive[W];
bool session[W];
bool cut[W];
byte outside_kills = 0;

#define terminal(j) (status[j] == DONE || status[j] == FAILED)
#define all_terminal (terminal(0) && terminal(1) && terminal(2))
/* The fence (lock = token, status active, lease not lapsed), as it stands
   here: no zombies in this model (lease.pml has them), so a job is its
   worker's while it is active, owned by it, and the worker lives. */
#define ours(w, j) (status[j] == ACTIVE && owner[j] == w && alive[w])

inline held(w, n) {
    n = 0;
    if :: status[0] == ACTIVE && owner[0] == w -> n++ :: else -> skip fi;
    if :: status[1] == ACTIVE && owner[1] == w -> n++ :: else -> skip fi;
    if :: status[2] == ACTIVE && owner[2] == w -> n++ :: else -> skip fi
}

inline isolating(w, k) {
    k = ((status[0] == ACTIVE && owner[0] == w && isolated[0])
        || (status[1] == ACTIVE && owner[1] == w && isolated[1])
        || (status[2] == ACTIVE && owner[2] == w && isolated[2]))
}

/* queries.sql: claim */
inline claim(w, j) {
    status[j] = ACTIVE; owner[j] = w; isolated[j] = false
}

/* queries.sql: release (a drain, or a suspect handed on) */
inline release(w, j) {
    assert(ours(w, j));
    status[j] = QUEUED; isolated[j] = false; owner[j] = NONE
}

/* A suspect's run: isolated if this worker isolates no other job
   (queries.sql: isolate), else handed on. */
inline start_suspect(w, j) {
    isolating(w, k);
    if
    :: !k -> isolated[j] = true
    :: else -> handoffs[j]++; release(w, j)
    fi
}

/* queries.sql: complete */
inline complete(w, j) {
    assert(ours(w, j));
    status[j] = DONE; isolated[j] = false
}

/* A worker's death: what it says about each of its jobs. */
inline dies(w, cause) {
    held(w, n);
    isolating(w, k);
    for (i : 0 .. J - 1) {
        if
        :: status[i] == ACTIVE && owner[i] == w && (isolated[i] || (!k && n == 1)) ->
#ifndef POOL_PROCESS
            evidence[i]++;     /* the rule's evidence: alone, or the isolated suspect */
            if :: isolated[i] && n > 1 -> beside[i]++ :: else -> skip fi
#else
            skip               /* handlers ran in children: the parent's death is not */
#endif
        :: else -> skip
        fi
    }
    alive[w] = false; session[w] = false
}

#ifdef POOL_PROCESS
/* queries.sql: child_died. The poison's child died, not the worker: charged
   exactly, requeued at once or failed as a job of death. */
inline child_died(w, j) {
    assert(ours(w, j));
    evidence[j]++;
    stalls[j]++;
    assert(stalls[j] <= evidence[j]);
    if
    :: stalls[j] > MAX_STALLS ->
        assert(evidence[j] >= MAX_STALLS + 1);
        assert(j == POISON);         /* its own child died max_stalls + 1 times */
        status[j] = FAILED
    :: else -> status[j] = QUEUED
    fi;
    owner[j] = NONE; isolated[j] = false
}
#endif

/* Run the handler of a job this worker holds. */
inline run_handler(w, j) {
    if
    :: j == POISON ->
#ifdef POOL_PROCESS
        child_died(w, j)
#else
        dies(w, j)             /* its handler kills the worker */
#endif
    :: j != POISON -> complete(w, j)
    fi
}

#define mine(w, j) (status[j] == ACTIVE && owner[j] == w)
#define room(w) (mine(w, 0) + mine(w, 1) + mine(w, 2) < CAP)
#define isolates(w) ((mine(w, 0) && isolated[0]) || (mine(w, 1) && isolated[1]) \
                     || (mine(w, 2) && isolated[2]))
/* A suspect is handed on at most MAX_HANDOFFS times; then it waits for a
   worker that isolates nothing (executor.py: SUSPECT_WAIT_S, MAX_HANDOFFS). */
#define may_take(w, j) (!suspect[j] || !isolates(w) || handoffs[j] < MAX_HANDOFFS)
#define gone(w, j) (!(status[j] == ACTIVE && owner[j] == w))
#define can_claim(w, j) (alive[w] && session[w] && status[j] == QUEUED)

proctype Worker(byte w) {
    byte n, i;
    bool k;
    do
    :: all_terminal -> break
    :: atomic { (can_claim(w, 0) && room(w) && may_take(w, 0)) -> claim(w, 0);
                if :: suspect[0] -> start_suspect(w, 0) :: else -> skip fi }
    :: atomic { (can_claim(w, 1) && room(w) && may_take(w, 1)) -> claim(w, 1);
                if :: suspect[1] -> start_suspect(w, 1) :: else -> skip fi }
    :: atomic { (can_claim(w, 2) && room(w) && may_take(w, 2)) -> claim(w, 2);
                if :: suspect[2] -> start_suspect(w, 2) :: else -> skip fi }
    :: atomic { ours(w, 0) -> run_handler(w, 0) }
    :: atomic { ours(w, 1) -> run_handler(w, 1) }
    :: atomic { ours(w, 2) -> run_handler(w, 2) }
    /* SIGKILL from outside (a deploy, an OOM kill of the pod) */
    :: atomic { alive[w] && outside_kills < 1 -> outside_kills++; dies(w, NONE) }
    /* a new process in its place, once the old one's jobs are back in line */
    :: atomic { (!alive[w] && cut[w] && gone(w, 0) && gone(w, 1) && gone(w, 2)) ->
        alive[w] = true; session[w] = true; cut[w] = false }
    od
}

inline charge(i) {
    stalls[i]++;
    suspect[i] = true;
    assert(stalls[i] <= evidence[i]);            /* charged only on evidence */
    /* a neighbour's crashes charge an isolated healthy suspect twice at most:
       the neighbour is a suspect itself by then, and never runs beside it */
    assert(i == POISON || beside[i] <= 2);
    if
    :: stalls[i] > MAX_STALLS ->                 /* a job of death */
        assert(evidence[i] >= MAX_STALLS + 1);
#if MAX_STALLS >= 3
        assert(i == POISON);   /* one outside kill and a neighbour's two never do it */
#endif
        status[i] = FAILED
    :: else -> skip
    fi
}

/* queries.sql: requeue_lapsed, every lapsed job of worker w in one statement */
inline requeue_worker(w) {
    held(w, n);
    isolating(w, k);
    for (i : 0 .. J - 1) {
        if
        :: status[i] == ACTIVE && owner[i] == w ->
#ifdef POOL_PROCESS
#ifndef PARENT_CHARGES
            if :: true -> skip fi      /* 'parent': requeued, nothing charged */
#else
            if :: isolated[i] || (!k && n == 1) -> charge(i) :: else -> skip fi
#endif
#else
#ifdef CHARGE_ALL
            charge(i)
#else
            if
            :: isolated[i] -> charge(i)                          /* own */
#ifdef BYSTANDER
            :: !isolated[i] && k -> charge(i)
#else
#ifdef OLD_BYSTANDER
            :: !isolated[i] && k -> skip
#else
            :: !isolated[i] && k ->           /* bystander: not charged, but it was there */
                witnessed[i]++; suspect[i] = suspect[i] || witnessed[i] >= 2
#endif
#endif
            :: !isolated[i] && !k && n == 1 -> charge(i)         /* own */
            :: !isolated[i] && !k && n > 1 ->                    /* witness */
                witnessed[i]++; suspect[i] = suspect[i] || witnessed[i] >= 2
            fi
#endif
#endif
            ;
            if
            :: status[i] == ACTIVE -> status[i] = QUEUED
            :: else -> skip
            fi;
            owner[i] = NONE; isolated[i] = false
        :: else -> skip
        fi
    }
}

/* queries.sql: workers_vanished. The cut leases then lapse (the database
   clock), all at once. */
#define lapsed(w) (cut[w] && !alive[w] && (mine(w, 0) || mine(w, 1) || mine(w, 2)))

proctype Reaper(byte r) {
    byte n, i;
    bool k;
    do
    :: all_terminal -> break
    :: atomic { !session[0] && !cut[0] -> cut[0] = true }
    :: atomic { !session[1] && !cut[1] -> cut[1] = true }
    :: atomic { lapsed(0) -> requeue_worker(0) }
    :: atomic { lapsed(1) -> requeue_worker(1) }
    od
}

init {
    byte i;
    atomic {
        for (i : 0 .. J - 1) { status[i] = QUEUED; owner[i] = NONE }
        for (i : 0 .. W - 1) { alive[i] = true; session[i] = true }
        run Worker(0); run Worker(1);
        run Reaper(0); run Reaper(1)
    }
}
