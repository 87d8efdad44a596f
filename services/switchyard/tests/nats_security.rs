//! The bus as the chart secures it, on a real nats-server running the
//! authorization `helm template` renders from the keys `switchyard keys chart`
//! made: each identity does what its role needs and is refused the rest, and
//! what a stolen service key can still publish is named by `log verify`.

mod support;

use std::time::Duration;

use async_nats::jetstream;
use switchyard_eventlog::EventLog as _;
use switchyard_eventlog::{Attributed, append_attributed, now_nanos};
use switchyard_proto::v1::{DomainEvent, ModuleSettingsObserved, NodeObserved, domain_event::Kind};
use switchyard_testkit::nats::{NatsOptions, NatsServer};
use tokio::sync::mpsc;

use support::secured::{Release, STREAM, switchyard};

/// Waits (up to 10 s) for the server to refuse something with a message
/// holding `expected`.
async fn refused(errors: &mut mpsc::UnboundedReceiver<String>, expected: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, errors.recv()).await {
            Ok(Some(error)) if error.contains(expected) => return,
            Ok(Some(error)) => seen.push(error),
            Ok(None) | Err(_) => {
                panic!("the server did not refuse {expected:?}; it said {seen:?}")
            }
        }
    }
}

/// The log as inventory opens it with `args`, after appending a node's
/// fact to it, signed.
async fn inventory_appends(
    args: switchyard_runtime::connect::NatsArgs,
) -> std::sync::Arc<dyn switchyard_eventlog::EventLog> {
    let client = args.service_client("inventory").await.unwrap();
    let log = args.log(client).await.unwrap();
    append_attributed(
        log.as_ref(),
        "inventory",
        "inventory",
        &[Attributed::fact(&node("n1"))],
        now_nanos(),
    )
    .await
    .unwrap();
    log
}

fn node(name: &str) -> DomainEvent {
    DomainEvent {
        kind: Some(Kind::NodeObserved(NodeObserved {
            node: name.into(),
            ..NodeObserved::default()
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_identity_does_what_its_role_needs_and_nothing_else() {
    let release = Release::render();
    let server = tokio::task::spawn_blocking({
        let extra = release.authorization.clone();
        move || {
            NatsServer::start_with(NatsOptions {
                extra,
                ..NatsOptions::default()
            })
        }
    })
    .await
    .unwrap();
    let url = server.url();

    // No credentials: no connection.
    let anonymous = async_nats::ConnectOptions::new()
        .max_reconnects(Some(1))
        .connect(&url)
        .await;
    assert!(anonymous.is_err(), "an unauthenticated client connected");
    let out = switchyard(&["log", "init", "--nats-url", &url]);
    assert!(!out.status.success(), "log init without credentials worked");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("uthorization"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // log-init creates the stream; nothing else does.
    let seed = release.seed("log-init");
    let out = switchyard(&[
        "log",
        "init",
        "--nats-url",
        &url,
        "--nats-nkey",
        seed.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A service appends its facts, signed, and follows the log.
    let log = inventory_appends(release.args(&url, "inventory")).await;
    let mut follow = log.follow(None, 1).await.unwrap();
    let first = tokio::time::timeout(
        Duration::from_secs(10),
        futures::StreamExt::next(&mut follow),
    )
    .await
    .expect("the follower passes the record on")
    .expect("a record")
    .unwrap();
    assert_eq!(first.envelope.actor, "inventory");

    // An operator reads and verifies it.
    let operator_seed = release.seed("ops@example.com");
    let keyring = release.keyring();
    let verify = || {
        switchyard(&[
            "log",
            "verify",
            "--nats-url",
            &url,
            "--nats-nkey",
            operator_seed.to_str().unwrap(),
            "--keyring",
            keyring.to_str().unwrap(),
        ])
    };
    let out = verify();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // A service may not take another's commands, send commands, or read
    // another's replies.
    let (client, mut errors) = release.connect(&url, "inventory").await;
    let _sub = client
        .subscribe("switchyard.cmd.stack-assigner")
        .await
        .unwrap();
    refused(
        &mut errors,
        "Subscription to \"switchyard.cmd.stack-assigner\"",
    )
    .await;
    client
        .publish(
            "switchyard.cmd.stack-assigner",
            "24 bytes of a command".into(),
        )
        .await
        .unwrap();
    refused(&mut errors, "Publish to \"switchyard.cmd.stack-assigner\"").await;
    let theirs = format!("_INBOX.{}.>", release.public_key("stack-assigner"));
    let _sub = client.subscribe(theirs.clone()).await.unwrap();
    refused(&mut errors, &format!("Subscription to \"{theirs}\"")).await;

    // An operator may not answer commands in a service's place, nor append.
    let (client, mut errors) = release.connect(&url, "ops@example.com").await;
    let _sub = client.subscribe("switchyard.cmd.>").await.unwrap();
    refused(&mut errors, "Subscription to \"switchyard.cmd.>\"").await;
    client
        .publish("switchyard.log.node.n1", "not a record".into())
        .await
        .unwrap();
    refused(&mut errors, "Publish to \"switchyard.log.node.n1\"").await;

    // No service may alter, purge or delete the stream.
    let (client, mut errors) = release.connect(&url, "stack-assigner").await;
    let js = jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(2))
        .build(client);
    let shrunk = jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec!["switchyard.log.>".into()],
        max_messages: 10,
        ..Default::default()
    };
    assert!(
        js.update_stream(&shrunk).await.is_err(),
        "a service altered the stream"
    );
    refused(
        &mut errors,
        &format!("Publish to \"$JS.API.STREAM.UPDATE.{STREAM}\""),
    )
    .await;
    assert!(
        js.delete_stream(STREAM).await.is_err(),
        "a service deleted the stream"
    );
    refused(
        &mut errors,
        &format!("Publish to \"$JS.API.STREAM.DELETE.{STREAM}\""),
    )
    .await;
    assert!(
        js.create_stream(jetstream::stream::Config {
            name: "ANOTHER".into(),
            subjects: vec!["another.>".into()],
            ..Default::default()
        })
        .await
        .is_err(),
        "a service created a stream"
    );
    refused(&mut errors, "Publish to \"$JS.API.STREAM.CREATE.ANOTHER\"").await;

    // What a stolen service key can still publish on its own subjects: a
    // record claiming another author, and one of a kind it never writes.
    // Both are named.
    let assigner = release.args(&url, "stack-assigner");
    let client = assigner.service_client("stack-assigner").await.unwrap();
    let log = assigner.log(client).await.unwrap();
    let settings = DomainEvent {
        kind: Some(Kind::ModuleSettingsObserved(ModuleSettingsObserved {
            dra_enabled: false,
            ..ModuleSettingsObserved::default()
        })),
    };
    for actor in ["inventory", "stack-assigner"] {
        append_attributed(
            log.as_ref(),
            "stack-assigner",
            actor,
            &[Attributed::fact(&settings)],
            now_nanos(),
        )
        .await
        .unwrap();
    }
    let out = verify();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let problems: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("problem:"))
        .collect();
    assert_eq!(problems.len(), 2, "{stdout}");
    assert!(
        problems[0].contains("claims to be written by inventory but is signed by stack-assigner"),
        "{stdout}"
    );
    assert!(
        problems[1].contains(
            "signed by stack-assigner, which never writes this kind of record (its author: inventory)"
        ),
        "{stdout}"
    );
    // The stream is as log-init made it, with every record.
    assert!(!stdout.contains("configured"), "{stdout}");
    assert_eq!(log.last_sequence(None).await.unwrap(), 3);
}

/// A CA, and a certificate it signed for the server's loopback address:
/// (CA PEM, server certificate PEM, server key PEM).
fn certificates() -> (String, String, String) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "switchyard-nats-ca");
    let ca =
        rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca.pem(), server.pem(), key.serialize_pem())
}

/// The bus over TLS: a client that trusts the server's CA (`--nats-tls-ca`)
/// connects, reads and writes; one without it, or trusting another CA, is
/// refused before it says who it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_only_clients_that_trust_the_servers_ca_connect() {
    let release = Release::render();
    let dir = release.dir.path();
    let (ca, cert, key) = certificates();
    let (other_ca, _, _) = certificates();
    for (file, pem) in [
        ("ca.pem", &ca),
        ("server.pem", &cert),
        ("server-key.pem", &key),
        ("other-ca.pem", &other_ca),
    ] {
        std::fs::write(dir.join(file), pem).unwrap();
    }
    let extra = format!(
        "{}\ntls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\n",
        release.authorization,
        dir.join("server.pem").display(),
        dir.join("server-key.pem").display()
    );
    let server = tokio::task::spawn_blocking(move || {
        NatsServer::start_with(NatsOptions {
            extra,
            ..NatsOptions::default()
        })
    })
    .await
    .unwrap();
    let url = server.url();
    let seed = release.seed("log-init");
    let init = |ca: Option<&str>| {
        let mut args = vec![
            "log",
            "init",
            "--nats-url",
            &url,
            "--nats-nkey",
            seed.to_str().unwrap(),
        ];
        if let Some(ca) = ca {
            args.extend(["--nats-tls-ca", ca]);
        }
        switchyard(&args)
    };
    let ca_path = dir.join("ca.pem");
    let other_path = dir.join("other-ca.pem");
    for refused in [None, Some(other_path.to_str().unwrap())] {
        let out = init(refused);
        assert!(
            !out.status.success(),
            "log init with CA {refused:?} connected:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let out = init(Some(ca_path.to_str().unwrap()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A service over TLS appends; an operator over TLS verifies.
    let mut inventory = release.args(&url, "inventory");
    inventory.auth.nats_tls_ca = Some(ca_path.clone());
    inventory_appends(inventory).await;
    let operator = release.seed(support::secured::OPERATOR);
    let keyring = release.keyring();
    let out = switchyard(&[
        "log",
        "verify",
        "--nats-url",
        &url,
        "--nats-nkey",
        operator.to_str().unwrap(),
        "--nats-tls-ca",
        ca_path.to_str().unwrap(),
        "--keyring",
        keyring.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("authorship: 1 of 1 records signed by the author they name"),
        "{stdout}"
    );
}
