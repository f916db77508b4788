use super::*;

const FIXTURE: &str = include_str!("testdata/bottlerocket-userdata.toml");

const CERT: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==";

fn base() -> String {
    format!(
        "[settings.kubernetes]\ncluster-name = \"c1\"\napi-server = \"https://x.eks.amazonaws.com\"\ncluster-certificate = \"{CERT}\"\n"
    )
}

fn err_of(extra: &str) -> UserDataError {
    validate(&format!("{}{extra}", base())).expect_err(extra)
}

#[test]
fn fixture_validates() {
    let p = validate(FIXTURE).expect("fixture is valid");
    assert_eq!(p.cluster_name, "prod-eks-1");
    assert_eq!(p.max_pods, Some(29));
    assert_eq!(p.cluster_dns_ip.as_deref(), Some("10.100.0.10"));
    assert_eq!(p.node_labels["example.com/node-pool"], "logging");
    assert_eq!(
        p.node_taints,
        vec![Taint {
            key: "example.com/dedicated".into(),
            value: "logging".into(),
            effect: "NoSchedule".into()
        }]
    );
    assert_eq!(p.sysctls["fs.inotify.max_user_watches"], "524288");
}

#[test]
fn gzip_input_is_accepted() {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(FIXTURE.as_bytes()).unwrap();
    let bytes = gz.finish().unwrap();
    assert_eq!(validate_bytes(&bytes).unwrap().cluster_name, "prod-eks-1");
}

#[test]
fn render_round_trips_and_explicit_fields_win() {
    let mut extra: Table = toml::from_str(
        "[kubernetes]\nmax-pods = 10\nshutdown-grace-period = \"30s\"\n[kubernetes.node-labels]\n\"a.io/x\" = \"extra\"\n\"a.io/y\" = \"kept\"\n",
    )
    .unwrap();
    extra.insert("motd".into(), "hi".into());
    let s = NodeSettings {
        cluster_name: "prod-eks-1".into(),
        api_server: "https://example.eks.amazonaws.com".into(),
        cluster_certificate: CERT.into(),
        cluster_dns_ip: Some("10.100.0.10".into()),
        max_pods: Some(58),
        node_labels: [("a.io/x".to_string(), "explicit".to_string())].into(),
        node_taints: [(
            "dedicated".to_string(),
            vec!["db:NoSchedule".to_string(), ":NoExecute".to_string()],
        )]
        .into(),
        sysctls: [("vm.max_map_count".to_string(), "262144".to_string())].into(),
        extra,
    };
    let text = render(&s).unwrap();
    let p = validate(&text).unwrap();
    assert_eq!(p.max_pods, Some(58));
    assert_eq!(p.node_labels["a.io/x"], "explicit");
    assert_eq!(p.node_labels["a.io/y"], "kept");
    assert_eq!(p.node_taints.len(), 2);
    assert_eq!(p.sysctls["vm.max_map_count"], "262144");
    assert_eq!(p.settings["motd"].as_str(), Some("hi"));
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encode_base64(&text))
        .unwrap();
    assert_eq!(decoded, text.as_bytes());
}

#[test]
fn render_refuses_invalid_settings() {
    let s = NodeSettings {
        cluster_name: "-bad".into(),
        api_server: "https://x".into(),
        cluster_certificate: CERT.into(),
        ..Default::default()
    };
    let e = render(&s).unwrap_err();
    assert_eq!(e.path(), Some("settings.kubernetes.cluster-name"));
}

#[test]
fn structural_errors() {
    assert_eq!(
        validate("[kubernetes]\ncluster-name = \"x\"\n").unwrap_err(),
        UserDataError::MissingSettings
    );
    assert!(matches!(
        validate("not toml ["),
        Err(UserDataError::Toml(_))
    ));
    let e = validate("[settings.kubernetes]\ncluster-name = \"c\"\n").unwrap_err();
    assert_eq!(e.path(), Some("settings.kubernetes.api-server"));
    let big = format!("{}# {}\n", base(), "x".repeat(MAX_USER_DATA_BYTES));
    assert!(matches!(
        validate(&big),
        Err(UserDataError::TooLarge { .. })
    ));
}

#[test]
fn bad_inputs_name_the_setting_and_the_fix() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "[settings.kubernetes.node-labels]\n\"Bad_Prefix/x\" = \"v\"\n",
            "settings.kubernetes.node-labels.\"Bad_Prefix/x\"",
            "DNS subdomain",
        ),
        (
            "[settings.kubernetes.node-labels]\nok = \"has space\"\n",
            "settings.kubernetes.node-labels.ok",
            "not a valid label value",
        ),
        (
            "[settings.kubernetes.node-taints]\nd = [\"x:Sometimes\"]\n",
            "settings.kubernetes.node-taints.d",
            "NoSchedule, PreferNoSchedule or NoExecute",
        ),
        (
            "[settings.kubernetes.node-taints]\nd = \"x:NoSchedule\"\n",
            "settings.kubernetes.node-taints.d",
            "not a list",
        ),
        (
            "[settings.kernel.sysctl]\n\"/proc/sys/x\" = \"1\"\n",
            "settings.kernel.sysctl.\"/proc/sys/x\"",
            "starts with '.' or '/'",
        ),
        (
            "[settings.kernel.sysctl]\n\"a..b\" = \"1\"\n",
            "settings.kernel.sysctl.\"a..b\"",
            "'..'",
        ),
        (
            "[settings.kernel.sysctl]\n\"vm.x\" = 1\n",
            "settings.kernel.sysctl.\"vm.x\"",
            "quote the value",
        ),
        (
            "[settings.kubernetes.eviction-hard]\n\"memory.free\" = \"10%\"\n",
            "settings.kubernetes.eviction-hard.\"memory.free\"",
            "not an eviction signal",
        ),
        (
            "[settings.kubernetes.eviction-hard]\n\"memory.available\" = \"100%\"\n",
            "settings.kubernetes.eviction-hard.\"memory.available\"",
            "below 100",
        ),
        (
            "[settings.kubernetes.system-reserved]\ngpu = \"1\"\n",
            "settings.kubernetes.system-reserved.gpu",
            "cpu, memory or ephemeral-storage",
        ),
        (
            "[settings.kubernetes.kube-reserved]\nmemory = \"lots\"\n",
            "settings.kubernetes.kube-reserved.memory",
            "quantity",
        ),
        (
            "[settings.host-containers.\"my_box\"]\nenabled = true\n",
            "settings.host-containers.my_box",
            "ASCII letters, digits and '-'",
        ),
        (
            "[settings.host-containers.custom]\nenabled = true\nsource = \"r/x:1\"\n",
            "settings.host-containers.custom.superpowered",
            "required",
        ),
        (
            "[settings.host-containers.admin]\nmode = \"once\"\n",
            "settings.host-containers.admin.mode",
            "host containers take",
        ),
        (
            "[settings.bootstrap-containers.prep]\nsource = \"r/x:1\"\nmode = \"sometimes\"\n",
            "settings.bootstrap-containers.prep.mode",
            "always, once or off",
        ),
        (
            "[settings.bootstrap-containers.prep]\nsource = \"r/x:1\"\nuser-data = \"%%%\"\n",
            "settings.bootstrap-containers.prep.user-data",
            "base64",
        ),
    ];
    for (extra, path, needle) in cases {
        let e = err_of(extra);
        assert_eq!(e.path(), Some(*path), "{extra}: {e}");
        assert!(e.to_string().contains(needle), "{extra}: {e}");
    }
}

#[test]
fn bad_core_kubernetes_values() {
    let with = |k: &str, v: &str| {
        let doc = base().replace(&format!("{k} = "), &format!("{k}-old = "));
        validate(&format!("{doc}{k} = {v}\n")).unwrap_err()
    };
    let e = with("cluster-name", "\"_nope\"");
    assert_eq!(e.path(), Some("settings.kubernetes.cluster-name"));
    let e = with("cluster-certificate", "\"not base64!\"");
    assert!(e.to_string().contains("base64"), "{e}");
    let e = with("api-server", "\"ftp://x\"");
    assert_eq!(e.path(), Some("settings.kubernetes.api-server"));
    let e = err_of("shutdown-grace-period = \"45\"\n");
    assert_eq!(e.path(), Some("settings.kubernetes.shutdown-grace-period"));
    let e = err_of("max-pods = -1\n");
    assert_eq!(e.path(), Some("settings.kubernetes.max-pods"));
    let e = err_of("cluster-dns-ip = \"ten\"\n");
    assert_eq!(e.path(), Some("settings.kubernetes.cluster-dns-ip"));
}

#[test]
fn node_labels_kubelet_refuses_are_rejected() {
    for key in [
        "node-role.kubernetes.io/worker",
        "app.kubernetes.io/name",
        "kubernetes.io/role",
        "example.k8s.io/x",
        "k8s.io/y",
    ] {
        let e = err_of(&format!(
            "[settings.kubernetes.node-labels]\n\"{key}\" = \"x\"\n"
        ));
        assert!(e.to_string().contains("kubelet refuses"), "{key}: {e}");
        assert_eq!(
            e.path(),
            Some(format!("settings.kubernetes.node-labels.\"{key}\"").as_str()),
            "{key}"
        );
    }
    for key in [
        "node.kubernetes.io/pool",
        "kubelet.kubernetes.io/x",
        "team.node.kubernetes.io/y",
        "topology.kubernetes.io/zone",
        "kubernetes.io/arch",
        "example.com/pool",
        "notkubernetes.io/z",
    ] {
        let ud = format!(
            "{}[settings.kubernetes.node-labels]\n\"{key}\" = \"x\"\n",
            base()
        );
        assert!(validate(&ud).is_ok(), "{key} is allowed");
    }
}
