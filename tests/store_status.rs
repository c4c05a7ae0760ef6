//! Both boxes say the same of their store on a log of application frames,
//! which no store request applies: the primary's store follows its durable
//! head as the twin's does, so each says it applied through the head
//! (the primary used to say 0 while the twin said the head).

#[path = "support/children.rs"]
mod children;

use std::time::Duration;

use children::Daemon;
use testkit::{free_tcp, free_udp};
use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::node::{Client, Durability, Status, TwinStatus};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_boxes_say_their_store_applied_through_the_head() {
    let root = tempfile::tempdir().expect("tempdir");
    let (p_dir, t_dir) = (root.path().join("p"), root.path().join("t"));
    let listen = free_udp();
    let (t_cfg, t_fp) = daemon::init_twin(&t_dir, listen, free_tcp(), None).expect("twin init");
    let (p_cfg, p_fp) =
        daemon::init_primary(&p_dir, listen, free_tcp(), Some(t_fp)).expect("primary init");
    daemon::pin_primary(&t_cfg, p_fp).expect("pin");
    let (p, t) = (
        PrimaryConfig::load(&p_cfg).expect("load"),
        TwinConfig::load(&t_cfg).expect("load"),
    );
    let _primary = Daemon::start("primary", &p_cfg, &root.path().join("p.log"));
    let _twin = Daemon::start("twin", &t_cfg, &root.path().join("t.log"));
    let admin = daemon::load_identity(&p_dir.join(daemon::ADMIN_DIR)).expect("admin");
    testkit::until("the primary serves", Duration::from_secs(30), || {
        daemon::fetch_status::<Status>(&p.metrics).ok().map(|_| ())
    })
    .await;
    let client = Client::connect(&admin, p_fp, listen).await.expect("client");
    client
        .create_repo("r", Durability::Local)
        .await
        .expect("create");
    let mut head = 0;
    for i in 0..200u32 {
        head = client
            .append(0x8000, b"", &i.to_le_bytes(), Durability::Twin)
            .await
            .expect("append")
            .0;
    }
    let applied = testkit::until("both stores at the head", Duration::from_secs(30), || {
        let (_, ps) = daemon::fetch_status::<Status>(&p.metrics).ok()?;
        let (_, ts) = daemon::fetch_status::<TwinStatus>(&t.metrics).ok()?;
        let pa = ps.store.as_ref()?.applied;
        (pa == head && ts.store.applied == head).then_some((pa, ts.store.applied))
    })
    .await;
    assert_eq!(applied, (head, head));
    assert_eq!(
        head, 201,
        "the repository's frame and 200 of the application's"
    );
}
