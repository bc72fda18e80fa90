/* jobq's publishing and delivery path with the lease protocol, as a Promela
   model for SPIN (tests/unit/test_model.py); model/lease.pml is the lease
   protocol alone with freezes. 2 workers x 3 jobs x 2 reapers, exhaustive:
   218 k states without freezes in CI; with -DFREEZE about 44 M states
   (4 minutes), run by hand.

   Publishing: the producer's insert, then its publish (or its death in
   between, left to the relay); the broker's copy of each id, a delivery
   taken by a consumer, claimed and then acked, redelivered if its consumer
   dies first; duplicates dropped; the reapers' relay and lost-message check;
   then the lease as in model/lease.pml (each step marked with the statement
   of queries.sql it stands for: "queries.sql:" and its name).

   Checked: no job lost (an end state with a job not completed is invalid),
   one owner for renewals and completions, stalls charged only on evidence.
   Mutation -DNO_RELAY (no relay: a row whose producer died before
   publishing is never delivered) must give a counterexample. */

#define W 2
#define J 3
#ifdef FREEZE
#define FREEZES true
#else
#define FREEZES false      /* model/lease.pml checks freezes; -DFREEZE: both (~44 M states) */
#endif
#define NONE 255

mtype = { QUEUED, ACTIVE, DONE };

mtype status[J];
bool published[J];       /* published_at set: a message is believed to carry it */
byte msgs[J];            /* copies of its id in the broker (ready or redeliverable) */
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
bool unacked[W * J];     /* a delivery taken and not acked yet */
byte crashes = 0;
byte freezes = 0;

#define TOK(w, j) mytok[(w) * J + (j)]
#define UNACKED(w, j) unacked[(w) * J + (j)]
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

/* One step of worker w on job j: take a delivery of it and claim it (the
   ack follows the committed claim; a delivery of a job not claimable is
   acked and dropped), ack, renew or complete. */
inline step(w, j) {
    if
    :: msgs[j] > 0 && TOK(w, j) == 0 && !UNACKED(w, j) ->
        msgs[j]--;
        if
        :: status[j] == QUEUED -> claim(w, j); UNACKED(w, j) = true
        :: else -> skip                 /* duplicate or not claimable: acked, dropped */
        fi
    :: UNACKED(w, j) -> UNACKED(w, j) = false   /* the ack */
    :: TOK(w, j) != 0 -> renew(w, j)
    :: TOK(w, j) != 0 -> complete(w, j)
    fi
}
#define can_step(w, j) (alive[w] && !frozen[w] && \
    ((msgs[j] > 0 && TOK(w, j) == 0 && !UNACKED(w, j)) || UNACKED(w, j) || TOK(w, j) != 0))

proctype Worker(byte w) {
    do
    :: all_done -> break
    :: atomic { can_step(w, 0) -> step(w, 0) }
    :: atomic { can_step(w, 1) -> step(w, 1) }
    :: atomic { can_step(w, 2) -> step(w, 2) }
    /* SIGKILL (or an OOM kill): the session ends with the process */
    :: atomic { alive[w] && crashes < 1 ->
        alive[w] = false; session[w] = false; troubled[w] = true; crashes++;
        /* the broker redelivers what the dead consumer had not acked */
        if :: UNACKED(w, 0) -> msgs[0]++; UNACKED(w, 0) = false :: else -> skip fi;
        if :: UNACKED(w, 1) -> msgs[1]++; UNACKED(w, 1) = false :: else -> skip fi;
        if :: UNACKED(w, 2) -> msgs[2]++; UNACKED(w, 2) = false :: else -> skip fi }
    /* SIGSTOP, then SIGCONT: the worker keeps its session */
    :: atomic { FREEZES && alive[w] && !frozen[w] && freezes < 1 ->
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
    status[j] = QUEUED; owner[j] = NONE; held_at_end[j] = 0;
    published[j] = false               /* its id goes out again through the relay */
}

/* queries.sql: relay_take */
#ifdef NO_RELAY
#define relayable(j) false
#else
#define relayable(j) (status[j] == QUEUED && !published[j] && msgs[j] == 0)
#endif
inline relay(j) { msgs[j]++; published[j] = true }
/* queries.sql: unpublish_lost (queued, published, and no message in the broker) */
#define lost(j) (status[j] == QUEUED && published[j] && msgs[j] == 0 && !taken(j))
#define taken(j) (UNACKED(0, j) || UNACKED(1, j))

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
    :: atomic { relayable(0) -> relay(0) }
    :: atomic { relayable(1) -> relay(1) }
    :: atomic { relayable(2) -> relay(2) }
    :: atomic { lost(0) -> published[0] = false }
    :: atomic { lost(1) -> published[1] = false }
    :: atomic { lost(2) -> published[2] = false }
    :: atomic { status[0] == ACTIVE && !lease_ok[0] -> requeue(0) }
    :: atomic { status[1] == ACTIVE && !lease_ok[1] -> requeue(1) }
    :: atomic { status[2] == ACTIVE && !lease_ok[2] -> requeue(2) }
    od
}

init {
    byte i;
    atomic {
        /* queries.sql: enqueue_many, then the id on the exchange; a producer
           that dies between the commit and the publish leaves the row to the
           relay (all jobs are in before the workers start: fewer
           interleavings, the same paths) */
        for (i : 0 .. J - 1) {
            status[i] = QUEUED; owner[i] = NONE;
            if :: msgs[i] = 1; published[i] = true :: skip fi
        }
        for (i : 0 .. W - 1) { alive[i] = true; session[i] = true }
        run Clock();
        run Worker(0); run Worker(1);
        run Reaper(0); run Reaper(1)
    }
}
