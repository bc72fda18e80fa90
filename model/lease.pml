/* jobq's lease protocol as a Promela model for SPIN (tests/unit/test_model.py).

   2 workers x 3 jobs x 2 reapers, exhaustively. Time is abstract: a live,
   running worker renews in time; a lease lapses only when its worker died
   (after a reaper cut its leases: queries.sql workers_vanished) or froze.
   Each step names the statement of services/jobq/queries.sql it stands for
   (marked "queries.sql:" and its name); the test fails when one disappears.

   Checked:
   - no job lost: every run ends with every job completed (the processes
     leave their loops only then, so any other end state is an invalid one);
   - one owner: a renewal, a completion, a failure (retry) or a release lands
     only for the worker that holds the job's current token (assertions in
     renew, complete and back_in_line);
   - a stall is charged only on evidence: the job was its dead (or frozen)
     worker's only active job (assertion in requeue);
   - a stall is charged only after its worker crashed or froze.

   Mutations (-D...), each of which must produce a counterexample:
   NO_FENCE   completion without the token fence;
   CUT_LIVE   the vanished cut applied to a live session that re-registered;
   CHARGE_ALL the witness rule charging every job of a dead worker. */

#define W 2
#define J 3
#define NONE 255

mtype = { QUEUED, ACTIVE, DONE };

mtype status[J];
byte lock[J];            /* token of the latest claim */
byte owner[J];           /* worker of the latest claim */
bool lease_ok[J];        /* the database still honours the lease */
byte stalls[J];
byte held_at_end[J];     /* active jobs its worker held when it died */

bool alive[W];           /* the process runs */
bool frozen[W];          /* SIGSTOPped: neither renews nor acts */
bool session[W];         /* its registry session (advisory lock) is held */
bool cut[W];             /* a reaper cut its leases */
bool troubled[W];        /* crashed or froze at some point */
byte mytok[W * J];       /* the token each worker believes it holds, 0: none */
byte crashes = 0;
byte freezes = 0;
byte backs = 0;          /* fails and releases so far */

#define TOK(w, j) mytok[(w) * J + (j)]
#define all_done (status[0] == DONE && status[1] == DONE && status[2] == DONE)

inline held(w, n) {
    n = 0;
    if :: status[0] == ACTIVE && owner[0] == w -> n++ :: else -> skip fi;
    if :: status[1] == ACTIVE && owner[1] == w -> n++ :: else -> skip fi;
    if :: status[2] == ACTIVE && owner[2] == w -> n++ :: else -> skip fi
}

/* queries.sql: claim */
inline claim(w, j) {
    status[j] = ACTIVE; lock[j]++; owner[j] = w;        /* a fresh token */
    lease_ok[j] = true; TOK(w, j) = lock[j]
}

/* queries.sql: renew */
inline renew(w, j) {
    if
    :: status[j] == ACTIVE && lock[j] == TOK(w, j) && lease_ok[j] ->
        assert(owner[j] == w)
    :: else -> TOK(w, j) = 0      /* lease lost: the handler is stopped */
    fi
}

/* queries.sql: complete */
inline complete(w, j) {
    if
#ifdef NO_FENCE
    :: status[j] == ACTIVE ->
#else
    :: status[j] == ACTIVE && lock[j] == TOK(w, j) && lease_ok[j] ->
#endif
        assert(owner[j] == w);     /* a completion by a non-owner never lands */
        status[j] = DONE
    :: else -> skip
    fi;
    TOK(w, j) = 0
}

/* queries.sql: fail (a retry) and queries.sql: release (a drain): fenced as
   complete; the job goes back in line with a fresh spell, nothing charged. */
inline back_in_line(w, j) {
    if
    :: status[j] == ACTIVE && lock[j] == TOK(w, j) && lease_ok[j] ->
        assert(owner[j] == w);     /* only the owner puts it back */
        status[j] = QUEUED; owner[j] = NONE
    :: else -> skip
    fi;
    TOK(w, j) = 0
}

/* One step of worker w on job j: claim it, renew it, complete it, or (job 0,
   once in a run) fail it for a retry or release it. */
inline step(w, j) {
    if
    :: status[j] == QUEUED && TOK(w, j) == 0 -> claim(w, j)
    :: TOK(w, j) != 0 -> renew(w, j)
    :: TOK(w, j) != 0 -> complete(w, j)
    :: j == 0 && TOK(w, j) != 0 && backs < 1 -> backs++; back_in_line(w, j)
    fi
}
#define can_step(w, j) (alive[w] && !frozen[w] && (TOK(w, j) != 0 || status[j] == QUEUED))

proctype Worker(byte w) {
    do
    :: all_done -> break
    :: atomic { can_step(w, 0) -> step(w, 0) }
    :: atomic { can_step(w, 1) -> step(w, 1) }
    :: atomic { can_step(w, 2) -> step(w, 2) }
    /* SIGKILL (or an OOM kill): the session ends with the process */
    :: atomic { alive[w] && crashes < 1 ->
        alive[w] = false; session[w] = false; troubled[w] = true; crashes++ }
    /* SIGSTOP, then SIGCONT: the worker keeps its session */
    :: atomic { alive[w] && !frozen[w] && freezes < 1 ->
        frozen[w] = true; troubled[w] = true; freezes++ }
    :: atomic { frozen[w] -> frozen[w] = false }
    od
}

/* The database clock: a lease lapses once its worker stopped renewing it
   (dead and cut, or frozen). */
proctype Clock() {
    do
    :: all_done -> break
    :: atomic {
        (status[0] == ACTIVE && lease_ok[0] && (cut[owner[0]] || frozen[owner[0]])) ->
        lease_ok[0] = false }
    :: atomic {
        (status[1] == ACTIVE && lease_ok[1] && (cut[owner[1]] || frozen[owner[1]])) ->
        lease_ok[1] = false }
    :: atomic {
        (status[2] == ACTIVE && lease_ok[2] && (cut[owner[2]] || frozen[owner[2]])) ->
        lease_ok[2] = false }
    od
}

/* queries.sql: workers_vanished */
inline cut_leases(w) {
    held(w, n);
    if :: status[0] == ACTIVE && owner[0] == w -> held_at_end[0] = n :: else -> skip fi;
    if :: status[1] == ACTIVE && owner[1] == w -> held_at_end[1] = n :: else -> skip fi;
    if :: status[2] == ACTIVE && owner[2] == w -> held_at_end[2] = n :: else -> skip fi;
    cut[w] = true
}

/* queries.sql: requeue_lapsed */
inline requeue(j) {
    if
    :: held_at_end[j] == 0 -> held(owner[j], n)   /* frozen: its active jobs now */
    :: else -> n = held_at_end[j]
    fi;
    if
#ifdef CHARGE_ALL
    :: true ->
#else
    :: n == 1 ->                       /* own: it ran alone on its worker */
#endif
        assert(n == 1);                /* charged only on evidence */
        assert(troubled[owner[j]]);    /* and only after a crash or a freeze */
        stalls[j]++
    :: else -> skip                    /* witness: requeued at once, not charged */
    fi;
    status[j] = QUEUED; owner[j] = NONE; held_at_end[j] = 0
}

#ifdef CUT_LIVE
#define vanished(w) (!cut[w])
#else
#define vanished(w) (!session[w] && !cut[w])
#endif

proctype Reaper(byte r) {
    byte n;
    do
    :: all_done -> break
    :: atomic { vanished(0) -> cut_leases(0) }
    :: atomic { vanished(1) -> cut_leases(1) }
    :: atomic { status[0] == ACTIVE && !lease_ok[0] -> requeue(0) }
    :: atomic { status[1] == ACTIVE && !lease_ok[1] -> requeue(1) }
    :: atomic { status[2] == ACTIVE && !lease_ok[2] -> requeue(2) }
    od
}

init {
    byte i;
    atomic {
        for (i : 0 .. J - 1) { status[i] = QUEUED; owner[i] = NONE }
        for (i : 0 .. W - 1) { alive[i] = true; session[i] = true }
        run Clock();
        run Worker(0); run Worker(1);
        run Reaper(0); run Reaper(1)
    }
}
