//! A transaction never waits for a second connection: checked in debug builds, on every path
//! the tests drive.
//!
//! A task that holds a transaction open and then asks the pool for another connection holds one
//! connection while it waits for a second. With a pool of N, N such tasks wait on each other
//! until the pool's timeout; behind a transaction pooler they hold its few server connections
//! the same way. A read the transaction needs runs on the transaction, or before it begins.
//!
//! In debug builds (every test, unit and end to end) each open [`Tx`](super::Tx) is noted under
//! its task, and [`Services::pool`](super::Services) refuses to lend the pool to a task that holds
//! one: it panics naming this rule, so the test that drives such a path fails where it runs, not
//! one run in many under a small pool. Release builds note nothing and check nothing.

/// One open transaction's note under its task; dropping it (the transaction committed, rolled
/// back or dropped) takes the note away.
#[derive(Debug)]
pub(crate) struct Held {
    #[cfg(debug_assertions)]
    task: Task,
}

/// Who runs: a spawned task, or the future a thread blocks on (a test's body, `block_on`), which
/// tokio gives no task id.
#[cfg(debug_assertions)]
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Task {
    Spawned(tokio::task::Id),
    BlockedOn(std::thread::ThreadId),
}

#[cfg(debug_assertions)]
impl Task {
    fn current() -> Task {
        match tokio::task::try_id() {
            Some(id) => Task::Spawned(id),
            None => Task::BlockedOn(std::thread::current().id()),
        }
    }
}

/// Per task: how many transactions it holds, and where the first of them was begun.
#[cfg(debug_assertions)]
type Open = std::collections::HashMap<Task, (usize, &'static std::panic::Location<'static>)>;

#[cfg(debug_assertions)]
static OPEN: std::sync::LazyLock<std::sync::Mutex<Open>> =
    std::sync::LazyLock::new(Default::default);

#[cfg(debug_assertions)]
fn open() -> std::sync::MutexGuard<'static, Open> {
    OPEN.lock().unwrap_or_else(|p| p.into_inner())
}

impl Held {
    /// Notes a transaction just begun by the current task, at `begun` (its caller's line).
    pub(crate) fn note(begun: &'static std::panic::Location<'static>) -> Held {
        #[cfg(debug_assertions)]
        {
            let task = Task::current();
            open().entry(task).or_insert((0, begun)).0 += 1;
            Held { task }
        }
        #[cfg(not(debug_assertions))]
        {
            let _ = begun;
            Held {}
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        {
            let mut open = open();
            if let Some((n, _)) = open.get_mut(&self.task) {
                *n -= 1;
                if *n == 0 {
                    open.remove(&self.task);
                }
            }
        }
    }
}

/// Where the transaction the current task holds open was begun (always `None` in release
/// builds).
pub(crate) fn held_since() -> Option<&'static std::panic::Location<'static>> {
    #[cfg(debug_assertions)]
    {
        open().get(&Task::current()).map(|(_, begun)| *begun)
    }
    #[cfg(not(debug_assertions))]
    None
}

/// Whether the current task holds a transaction open (always `false` in release builds).
#[cfg(test)]
fn holds_a_transaction() -> bool {
    held_since().is_some()
}

/// The error line a broken rule logs (before its panic), for what runs the services in another
/// process and reads their logs (the e2e stacks: a background job survives the panic as a failed
/// run, so its log is where the breach shows).
pub const SECOND_CONNECTION_LOGGED: &str = "a transaction waits for a second connection";

/// Called where the pool lends a connection: a task holding a transaction may not ask for one.
#[track_caller]
pub(crate) fn check_lend() {
    if let Some(begun) = held_since() {
        let at = std::panic::Location::caller();
        tracing::error!(
            at = %at,
            begun = %begun,
            "{SECOND_CONNECTION_LOGGED}: read on the transaction or before it begins"
        );
        panic!(
            "a task holding a transaction (begun at {begun}) asked the pool for a second \
             connection at {at}: read on the transaction (`&mut **tx`) or before it begins \
             (docs/architecture.md, \"No transaction waits for a second connection\")"
        );
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_holding_a_transaction_is_noted_until_it_ends_and_other_tasks_are_not() {
        assert!(!holds_a_transaction());
        let first = Held::note(std::panic::Location::caller());
        let second = Held::note(std::panic::Location::caller());
        assert!(holds_a_transaction());
        // Another task holds nothing of this one's.
        let elsewhere = tokio::spawn(async { holds_a_transaction() }).await.expect("task");
        assert!(!elsewhere, "a transaction is noted under its own task only");
        drop(first);
        assert!(holds_a_transaction(), "one of two still open");
        drop(second);
        assert!(!holds_a_transaction(), "both ended");
        let refused = tokio::spawn(async {
            let _held = Held::note(std::panic::Location::caller());
            check_lend();
        })
        .await;
        assert!(refused.is_err_and(|e| e.is_panic()), "lending to a task holding one panics");
        check_lend();
        // A test's own body (no task id: the thread blocks on it) is held to the same rule.
        let body = std::panic::catch_unwind(|| {
            let _held = Held::note(std::panic::Location::caller());
            check_lend();
        });
        assert!(body.is_err(), "lending to a body holding one panics");
        assert!(!holds_a_transaction(), "its note went with it");
    }
}
