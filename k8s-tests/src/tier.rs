//! One cluster test body, two tiers: the kwok Node (fast; the fault cases) and the real node
//! (kubelet, containerd, runc, CNI; the test gateway's image really runs). A test that can run
//! on both starts a [`TierCluster`] for the tier it is given and takes its cluster settings from
//! [`TierCluster::settings_json`], so the same assertions meet fake Pods on one tier and real
//! ones on the other.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::control_plane::ControlPlane;
use crate::error::{Error, Result};
use crate::gateway_image::{TEST_GATEWAY_PATH, test_gateway_image};
use crate::image::BuiltImage;
use crate::node::{NODE_STORAGE_CLASS, Node, NodeTimings, REAL_NODE_LABEL};

/// Where a cluster test's Pods run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The control plane's kwok Node: Pods are marked Running and Ready, no container runs.
    Kwok,
    /// The real node ([`Node`]): the test gateway's image runs as the Agent's gateway.
    RealNode,
}

impl Tier {
    /// The tier's name in the figures (`kwok`, `real-node`).
    pub fn name(self) -> &'static str {
        match self {
            Tier::Kwok => "kwok",
            Tier::RealNode => "real-node",
        }
    }

    /// Why this tier cannot run here (see [`crate::skip_reason`] and
    /// [`crate::node_skip_reason`]; under `CI=true` a missing prerequisite panics).
    pub fn skip_reason(self) -> Option<String> {
        match self {
            Tier::Kwok => crate::skip_reason(),
            Tier::RealNode => crate::node_skip_reason(),
        }
    }
}

/// What a tier's start took, printed as it ends (`FIGURE tier ... started in`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TierTimings {
    /// `ControlPlane::start` (the node's preparation and the image build run beside it).
    pub control_plane: Duration,
    /// The real node's parts: `prepare` beside the control plane, then `join`.
    pub node: NodeTimings,
    /// The test gateway's image built, beside the control plane (cold: a static cargo build).
    pub image_build: Duration,
    /// The image imported into the node's containerd.
    pub image_import: Duration,
    /// From the call of [`TierCluster::start`] until it returned.
    pub total: Duration,
}

/// A control plane, and on [`Tier::RealNode`] a real node with the test gateway's image
/// imported. Dereferences to its [`ControlPlane`]. Dropping it tears the node down first, then
/// the control plane; [`TierCluster::finish`] also checks the node's teardown.
pub struct TierCluster {
    // Field order is drop order: the node before its control plane.
    node: Option<Node>,
    cp: ControlPlane,
    tier: Tier,
    image: Option<BuiltImage>,
    work: Option<WorkDir>,
    timings: TierTimings,
    started: Instant,
}

impl TierCluster {
    /// Starts the tier's cluster. On the real node the test gateway's image is built while
    /// the control plane starts (a cold static build of the gateway takes longer than the
    /// control plane), then the node starts and the image is imported by digest.
    pub async fn start(tier: Tier) -> Result<TierCluster> {
        match tier {
            Tier::Kwok => {
                let t0 = Instant::now();
                let cp = ControlPlane::start().await?;
                let timings = TierTimings {
                    control_plane: t0.elapsed(),
                    total: t0.elapsed(),
                    ..TierTimings::default()
                };
                Ok(Self::started(tier, cp, None, None, None, timings, t0))
            }
            Tier::RealNode => Self::start_real_node().await,
        }
    }

    /// The control plane, the node's runtime ([`Node::prepare`]) and the test gateway's image
    /// build at once; then the image imported and the node joined (the kubelet needs the
    /// control plane).
    async fn start_real_node() -> Result<TierCluster> {
        let t0 = Instant::now();
        let config = crate::config::HarnessConfig::from_env()?;
        let images = config.state_dir.join("images");
        remove_stale_work_dirs(&images);
        let work = WorkDir(images.join(format!(
            "{}-{}",
            std::process::id(),
            crate::sys::random_hex(3)?
        )));
        crate::sys::create_dir_all(&work.0)?;
        let w = work.0.clone();
        let build = tokio::task::spawn_blocking(move || {
            let t = Instant::now();
            test_gateway_image(&w).map(|i| (i, t.elapsed()))
        });
        let node_config = config.clone();
        let prepare = tokio::spawn(async move { Node::prepare(&node_config).await });
        let cp = ControlPlane::start_with(&config).await;
        let control_plane = t0.elapsed();
        let node = prepare.await.map_err(|e| Error::Node {
            reason: format!("the node's preparation did not finish: {e}"),
        });
        let built = build.await.map_err(|e| Error::Image {
            reason: format!("the test gateway's image build did not finish: {e}"),
        });
        let (cp, mut node) = (cp?, node??);
        let (image, image_build) = built??;
        let t = Instant::now();
        node.import_image(&image)?;
        let import = t.elapsed();
        node.join(&cp).await?;
        let timings = TierTimings {
            control_plane,
            node: node.timings(),
            image_build,
            image_import: import,
            total: t0.elapsed(),
        };
        Ok(Self::started(
            Tier::RealNode,
            cp,
            Some(node),
            Some(image),
            Some(work),
            timings,
            t0,
        ))
    }

    fn started(
        tier: Tier,
        cp: ControlPlane,
        node: Option<Node>,
        image: Option<BuiltImage>,
        work: Option<WorkDir>,
        timings: TierTimings,
        started: Instant,
    ) -> TierCluster {
        eprintln!(
            "FIGURE tier {} started in {:.1} s (at once: control plane {:.1} s, {}, test gateway image built {:.1} s; then image imported {:.1} s, {})",
            tier.name(),
            timings.total.as_secs_f64(),
            timings.control_plane.as_secs_f64(),
            match &node {
                Some(_) => format!(
                    "node's containerd and pause {:.1} s",
                    timings.node.prepare.as_secs_f64()
                ),
                None => "no node".to_owned(),
            },
            timings.image_build.as_secs_f64(),
            timings.image_import.as_secs_f64(),
            match &node {
                Some(_) => format!(
                    "kubelet to Node Ready {:.1} s",
                    timings.node.join.as_secs_f64()
                ),
                None => "no kubelet".to_owned(),
            },
        );
        TierCluster {
            node,
            cp,
            tier,
            image,
            work,
            timings,
            started,
        }
    }

    /// The tier this cluster was started for.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// The control plane.
    pub fn control_plane(&self) -> &ControlPlane {
        &self.cp
    }

    /// The real node (`None` on the kwok tier).
    pub fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }

    /// The image the Agents' gateways run on this tier: the test gateway's, by digest, on the
    /// real node; `kwok_image` on the kwok tier (never pulled there).
    pub fn gateway_image(&self, kwok_image: &str) -> String {
        match &self.image {
            Some(i) => i.reference.clone(),
            None => kwok_image.to_owned(),
        }
    }

    /// What start took.
    pub fn timings(&self) -> TierTimings {
        self.timings
    }

    /// The cluster settings for this tier, in the JSON form `occ cluster add --settings` and
    /// `ClusterSettings::from_json` take. On the kwok tier: `kwok_image` and `storage_class`
    /// (the test's own class, or the backend's default when `None`). On the real node: the
    /// test gateway's image by digest and its command, the node's StorageClass
    /// ([`NODE_STORAGE_CLASS`]) and the node selector of [`REAL_NODE_LABEL`].
    pub fn settings_json(&self, kwok_image: &str, storage_class: Option<&str>) -> Value {
        match &self.image {
            Some(image) => json!({
                "gatewayImage": image.reference,
                "gatewayCommand": [TEST_GATEWAY_PATH],
                "storageClass": NODE_STORAGE_CLASS,
                "nodeSelector": { REAL_NODE_LABEL.0: REAL_NODE_LABEL.1 },
            }),
            None => {
                let mut s = json!({ "gatewayImage": kwok_image });
                if let Some(class) = storage_class {
                    s["storageClass"] = json!(class);
                }
                s
            }
        }
    }

    /// Ends a test that passed: prints `FIGURE tier <tier> <test>` (the start and the whole
    /// run), tears the node down (draining its Pods), stops the control plane, and fails with
    /// what either teardown could not do or left behind (the node's leftover check, the
    /// sysctls).
    pub async fn finish(mut self, test: &str) -> std::result::Result<(), String> {
        let total = self.started.elapsed();
        eprintln!(
            "FIGURE tier {} {test}: {:.1} s in all, {:.1} s of it starting",
            self.tier.name(),
            total.as_secs_f64(),
            self.timings.total.as_secs_f64(),
        );
        let mut failures = Vec::new();
        if let Some(node) = self.node.take() {
            let record = node.record().clone();
            let t = Instant::now();
            let report = node.shutdown().await;
            eprintln!(
                "EVIDENCE leftover check after node {}'s teardown ({:.1} s with the drain): problems {:?}, leftovers {:?}, sysctls {:?}",
                record.id,
                t.elapsed().as_secs_f64(),
                report.problems,
                report.leftovers,
                report.sysctls
            );
            failures.extend(report.problems);
            failures.extend(report.leftovers);
            failures.extend(report.sysctls);
        }
        drop(self.work.take());
        if let Err(e) = self.cp.teardown() {
            failures.push(format!("the control plane's teardown: {e}"));
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("; "))
        }
    }
}

/// The directory the test gateway's image is built in (`<state>/images/<pid>-<hex>`),
/// removed when dropped, also when the start fails.
#[derive(Debug)]
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!(
                "clawfleet-k8s-tests: cannot remove {}: {e}",
                self.0.display()
            );
        }
    }
}

/// Removes the image work directories (`<pid>-<hex>`) of test processes that no longer run
/// (killed before their Drop); live ones are left alone.
fn remove_stale_work_dirs(images: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(images) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !crate::sys::process_alive(pid, None)
            && let Err(err) = std::fs::remove_dir_all(e.path())
        {
            eprintln!(
                "clawfleet-k8s-tests: cannot remove the stale {}: {err}",
                e.path().display()
            );
        }
    }
}

impl std::ops::Deref for TierCluster {
    type Target = ControlPlane;
    fn deref(&self) -> &ControlPlane {
        &self.cp
    }
}

impl std::fmt::Debug for TierCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierCluster")
            .field("tier", &self.tier)
            .field("node", &self.node)
            .field("timings", &self.timings)
            .finish_non_exhaustive()
    }
}

impl Drop for TierCluster {
    fn drop(&mut self) {
        // The node first (its own Drop tears it down), then the image's work dir; the control
        // plane drops after this body.
        drop(self.node.take());
        drop(self.work.take());
    }
}
