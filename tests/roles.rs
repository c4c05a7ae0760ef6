//! Roles for pinned clients: a reader reads, a writer also writes
//! application frames and the store, only an admin erases, retains, skips,
//! deletes repositories or appends twinlog's reserved kinds. Every refusal
//! is named and writes nothing.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::watch;
use twinlog::log::Log;
use twinlog::net::{self, Identity, Pins, Role};
use twinlog::node::api::ClientRole;
use twinlog::node::store_host::StoreHost;
use twinlog::node::{ApiError, Client, ClientError, Durability, Primary, PrimaryOptions};
use twinlog::store::StoreOptions;

fn forbidden<T: std::fmt::Debug>(r: Result<T, ClientError>) -> bool {
    matches!(r, Err(ClientError::Api(ApiError::Forbidden(_))))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verb_is_tried_with_each_role_and_refusals_write_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pid = Identity::mint().expect("mint");
    let ids: Vec<(ClientRole, Identity)> = [ClientRole::Read, ClientRole::Write, ClientRole::Admin]
        .into_iter()
        .map(|r| (r, Identity::mint().expect("mint")))
        .collect();
    let mut pins = Pins::new();
    let mut roles = HashMap::new();
    for (r, id) in &ids {
        pins = pins.pin(id.fingerprint(), Role::Client);
        roles.insert(id.fingerprint(), *r);
    }
    let pins = Arc::new(pins);
    let log = Arc::new(Log::open(dir.path().join("log")).expect("log"));
    let store = StoreHost::open(
        log.clone(),
        &dir.path().join("store"),
        StoreOptions::default(),
    )
    .expect("store");
    let endpoint = net::server(([127, 0, 0, 1], 0).into(), &pid, pins.clone()).expect("server");
    let addr = endpoint.local_addr().expect("addr");
    let primary = Primary::with_store(log.clone(), pins, PrimaryOptions::default(), Some(store));
    primary.set_client_roles(roles);
    let (_stop, stopped) = watch::channel(false);
    tokio::spawn(primary.clone().serve(endpoint, stopped));
    let mut clients = Vec::new();
    for (_, id) in &ids {
        clients.push(
            Client::connect(id, pid.fingerprint(), addr)
                .await
                .expect("connect"),
        );
    }
    let (reader, writer, admin) = (&clients[0], &clients[1], &clients[2]);
    let local = Durability::Local;

    // The admin makes something to read.
    admin.create_repo("r", local).await.expect("create");
    let (first, _) = admin
        .append(0x8001, b"", b"one", local)
        .await
        .expect("append");

    // A reader reads, and writes nothing.
    let head = log.head_seq();
    assert_eq!(reader.read(first).await.expect("read").blob, b"one");
    reader.status().await.expect("status");
    reader.refs("r").await.expect("refs");
    assert!(forbidden(reader.append(0x8001, b"", b"x", local).await));
    assert!(forbidden(reader.create_repo("s", local).await));
    assert!(forbidden(reader.put_doc("d", b"x", local).await));
    assert!(forbidden(reader.erase(1, &["r".into()], local).await));
    assert!(forbidden(reader.retain_from(1, true).await));
    assert_eq!(log.head_seq(), head, "a reader wrote");

    // A writer writes application frames and the store, nothing more.
    writer
        .append(0x8001, b"", b"two", local)
        .await
        .expect("append");
    writer.create_repo("w", local).await.expect("create");
    writer.put_doc("d", b"x", local).await.expect("doc");
    let head = log.head_seq();
    assert!(forbidden(
        writer.append(9, b"", b"reserved kind", local).await
    ));
    assert!(forbidden(writer.erase(1, &["r".into()], local).await));
    assert!(forbidden(writer.retain_from(1, true).await));
    assert!(forbidden(writer.delete_repo("w", local).await));
    assert!(forbidden(writer.store_retry().await));
    assert!(forbidden(writer.store_skip(1, "x", true, local).await));
    assert_eq!(log.head_seq(), head, "a writer's refused requests wrote");

    // The admin may do all of it.
    admin
        .erase(head + 1, &["r".into()], local)
        .await
        .expect("erase");
    admin.delete_repo("w", local).await.expect("delete");
    admin.store_retry().await.expect("retry");
    admin.retain_from(1, true).await.expect("retain");
}
