/* Suspension (issue #52, DESIGN I12) as a Promela model for SPIN
   (tests/unit/test_model.py): park -> signal -> wake, whatever races.

   One job waits for a signal (job.wait_for); 2 consumers, 2 reapers, a
   producer whose signal transaction may roll back before one commits, and
   up to 2 SIGKILLs of the consumer running the job at any step of its run.
   Each step names the statement of services/jobq/queries.sql it stands for
   ("queries.sql:" and its name); the test fails when one disappears.

   The real statements read under a snapshot and write under a row lock: the
   suspend statement reads the mailbox (its snapshot) and then parks the
   row, so a signal can commit, and a wake duty run, between the two. That
   window is a step of its own here.

   Checked:
   - never lost: every run ends with the job done, having got the signal
     (the consumers leave their loops only then: any other end is invalid);
   - never twice at once: at most one handler runs the job (assert at claim);
   - woken once: the wake duty wakes the parked job at most once.

   Mutations (-D...), each of which must produce a counterexample:
   MARK_ANY   the wake duty marks a signal seen although the job was still
              running (a lost mailbox entry: the job parks and sleeps forever);
   WAKE_ANY   the wake duty makes the job due without the park (no recheck
              of wake_on under the lock): a second consumer runs it at once. */

#define W 2

mtype = { QUEUED, ACTIVE, PARKED, DONE };

mtype status = QUEUED;
bool due = true;         /* published or relay due: a claim may take it */
bool waiting = false;    /* job.wake_on: parked for the signal */
bool sig = false;        /* a committed signal in jobq.job_signal */
bool delivered = false;  /* a wake or the job's read saw it */
byte lock = 0;           /* the latest claim's token */
byte lapsed = 0;         /* the token of a run whose consumer was killed */
byte running = 0;        /* handlers running the job now */
byte wakes = 0;
byte crashes = 0;
byte rollbacks = 0;

proctype Consumer() {
    byte t;
    bool seen;
    bool snap;
    do
    :: atomic {  /* queries.sql: claim */
           status == QUEUED && due ->
           status = ACTIVE; due = false; lock++; t = lock; running++;
           assert(running <= 1)
       }
       /* job.wait_for: queries.sql: signal_get, fenced by the token */
       atomic {
           seen = (lock == t && status == ACTIVE && sig);
           if :: seen -> delivered = true :: else -> skip fi
       }
       if
       :: crashes < 2 -> atomic { crashes++; lapsed = t; running-- }  /* SIGKILL */
       :: seen ->  /* queries.sql: complete */
          atomic {
              if :: lock == t && status == ACTIVE -> status = DONE :: else -> skip fi;
              running--
          }
       :: !seen ->
          snap = sig;  /* queries.sql: suspend, its snapshot of the mailbox */
          if
          :: crashes < 2 -> atomic { crashes++; lapsed = t; running-- }  /* SIGKILL */
          :: atomic {  /* queries.sql: suspend, the row under its lock */
                 if
                 :: lock == t && status == ACTIVE ->
                    if
                    :: snap -> status = QUEUED; due = true  /* the signal is here */
                    :: else -> status = PARKED; waiting = true
                    fi
                 :: else -> skip
                 fi;
                 running--
             }
          fi
       fi
    :: status == DONE -> break
    od
}

proctype Reaper() {
end_idle:
    do
    :: atomic {  /* queries.sql: requeue_lapsed (the killed consumer's lease) */
           status == ACTIVE && lapsed == lock -> status = QUEUED; due = true
       }
    :: atomic {  /* queries.sql: wake_signalled */
           sig && !delivered ->
           if
#ifdef WAKE_ANY
           :: status != DONE -> status = QUEUED; due = true; waiting = false;
                                delivered = true; wakes++
#else
           :: status == PARKED && waiting -> status = QUEUED; due = true; waiting = false;
                                             delivered = true; wakes++
#endif
           :: status == DONE -> delivered = true
#ifdef MARK_ANY
           :: status == ACTIVE -> delivered = true
#endif
           :: else -> skip  /* still running or queued: its read or suspend sees it */
           fi;
           assert(wakes <= 1)
       }
    od
}

proctype Producer() {
    do
    :: atomic { status != DONE && !sig -> sig = true }  /* jobq.signal, committed */
       break
    :: rollbacks < 1 -> rollbacks++  /* jobq.signal in a transaction rolled back: nothing */
    od
}

init {
    atomic {
        run Consumer(); run Consumer();
        run Reaper(); run Reaper();
        run Producer()
    }
}
