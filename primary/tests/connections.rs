//! The command line closes its connection before it exits: a script that
//! runs `primary append` once per frame leaves no connection held on the
//! primary, where each used to hold its place until QUIC's idle timeout
//! (and four such loops filled every place there is).

use std::time::{Duration, Instant};

use twinlog::node::Status;

mod support;
use support::{exits, Primary};

#[test]
fn a_loop_of_appends_from_the_command_line_leaves_no_connection_held() {
    let p = Primary::init();
    let _d = p.serve();
    for i in 0..20 {
        exits(
            &p.run(&["append", "--text", &format!("frame {i}")]),
            0,
            "append",
        );
    }
    // Each closed its connection as it exited: within moments none is
    // held, well inside the 5 s a dead one would hold its place.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let (_, s) =
            twinlog::daemon::fetch_status::<Status>(p.metrics).expect("the primary's status");
        if s.client_connections == 0 {
            assert_eq!(s.head, 20);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} connections still held after the loop ended",
            s.client_connections
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
