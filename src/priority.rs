//! Scheduling priority for background scrubs: a nightly check should use what the machine
//! leaves idle, not compete with the person using it.

use std::io;

/// Puts the calling thread, and every thread it starts afterwards, at the lowest CPU and I/O
/// priority: nice 19 and `SCHED_IDLE` for the CPU, the idle class for I/O.
///
/// Each step is best effort; the errors of those that failed are returned for a warning.
pub fn background() -> Vec<io::Error> {
    let mut failed = Vec::new();
    // SAFETY: plain syscalls on the calling thread with valid arguments.
    unsafe {
        if libc::setpriority(libc::PRIO_PROCESS, 0, 19) != 0 {
            failed.push(io::Error::last_os_error());
        }
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            failed.push(io::Error::last_os_error());
        }
        // ioprio_set(IOPRIO_WHO_PROCESS, 0, IOPRIO_PRIO_VALUE(IOPRIO_CLASS_IDLE, 0))
        const IOPRIO_WHO_PROCESS: libc::c_int = 1;
        const IOPRIO_CLASS_IDLE: libc::c_int = 3;
        const IOPRIO_CLASS_SHIFT: libc::c_int = 13;
        let prio = IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT;
        if libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, prio) != 0 {
            failed.push(io::Error::last_os_error());
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    #[test]
    fn background_lowers_this_thread_only_for_its_children() {
        std::thread::spawn(|| {
            assert!(super::background().is_empty());
            // SAFETY: plain queries of the calling thread.
            let (nice, policy) = unsafe {
                (
                    libc::getpriority(libc::PRIO_PROCESS, 0),
                    libc::sched_getscheduler(0),
                )
            };
            assert_eq!(nice, 19);
            assert_eq!(policy, libc::SCHED_IDLE);
            let child = std::thread::spawn(|| unsafe { libc::sched_getscheduler(0) })
                .join()
                .unwrap();
            assert_eq!(child, libc::SCHED_IDLE);
        })
        .join()
        .unwrap();
    }
}
