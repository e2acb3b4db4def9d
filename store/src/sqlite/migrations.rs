//! The SQLite schema as versioned migrations. Never edit a released one: add a new one here
//! and the same version to `store/src/postgres/migrations.rs`.

/// Migrations, in order; version N is `MIGRATIONS[N - 1]`.
pub const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    "
    CREATE TABLE hosts (
        name TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        port INTEGER NOT NULL,
        host_key TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        max_agents INTEGER NOT NULL,
        enrolled_at INTEGER NOT NULL,
        last_probe TEXT
    );
    CREATE TABLE namespaces (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        deleting INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE namespace_hosts (
        namespace_id TEXT NOT NULL REFERENCES namespaces(id) ON DELETE CASCADE,
        host_name TEXT NOT NULL REFERENCES hosts(name),
        ready INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (namespace_id, host_name)
    );
    CREATE TABLE configurations (
        namespace_id TEXT NOT NULL REFERENCES namespaces(id) ON DELETE CASCADE,
        id TEXT NOT NULL,
        generation INTEGER NOT NULL,
        document TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (namespace_id, id, generation)
    );
    CREATE TABLE agents (
        namespace_id TEXT NOT NULL REFERENCES namespaces(id) ON DELETE CASCADE,
        id TEXT NOT NULL,
        service_principal_id TEXT NOT NULL,
        configuration_id TEXT NOT NULL,
        desired_state TEXT NOT NULL,
        host_name TEXT REFERENCES hosts(name),
        port INTEGER,
        active_revision_id TEXT,
        served_revision_id TEXT,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (namespace_id, id)
    );
    CREATE TABLE revisions (
        namespace_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        id TEXT NOT NULL,
        number INTEGER NOT NULL,
        configuration_id TEXT NOT NULL,
        configuration_generation INTEGER NOT NULL,
        configuration_hash TEXT NOT NULL,
        rendered TEXT NOT NULL,
        status TEXT NOT NULL,
        last_code TEXT,
        last_message TEXT,
        last_at INTEGER,
        attempts INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (namespace_id, agent_id, id),
        UNIQUE (namespace_id, agent_id, number),
        FOREIGN KEY (namespace_id, agent_id) REFERENCES agents(namespace_id, id) ON DELETE CASCADE
    );
    CREATE TABLE work (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        namespace_id TEXT NOT NULL,
        agent_id TEXT,
        revision_id TEXT,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        not_before INTEGER NOT NULL,
        lease_owner TEXT,
        lease_until INTEGER,
        last_code TEXT,
        last_message TEXT,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE INDEX work_ready ON work(state, not_before);
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        secret_hash TEXT NOT NULL UNIQUE,
        created_at INTEGER NOT NULL,
        revoked INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE token_grants (
        token_id TEXT NOT NULL REFERENCES tokens(id) ON DELETE CASCADE,
        namespace TEXT NOT NULL,
        role TEXT NOT NULL,
        PRIMARY KEY (token_id, namespace)
    );
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at INTEGER NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        detail TEXT NOT NULL
    );
    ",
    // 2: clusters (the Kubernetes backend); a Namespace is on a host pool or on one cluster.
    "
    CREATE TABLE clusters (
        name TEXT PRIMARY KEY,
        server TEXT NOT NULL,
        credentials TEXT NOT NULL,
        settings TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        last_probe TEXT
    );
    ALTER TABLE namespaces ADD COLUMN cluster_name TEXT REFERENCES clusters(name);
    ALTER TABLE namespaces ADD COLUMN cluster_ready INTEGER NOT NULL DEFAULT 0;
    ",
    // 3: Namespace createdAt in seconds like every other timestamp (it was milliseconds);
    // tokens may expire.
    "
    UPDATE namespaces SET created_at = created_at / 1000 WHERE created_at > 100000000000;
    ALTER TABLE tokens ADD COLUMN expires_at INTEGER;
    ",
    // 4: single-tenant pools (hosts that run one Namespace's Agents only).
    "
    ALTER TABLE namespaces ADD COLUMN single_tenant INTEGER NOT NULL DEFAULT 0;
    ",
    // 5: the evidence of a revision's failed activation (runtimeFailure, JSON).
    "
    ALTER TABLE revisions ADD COLUMN runtime_failure TEXT;
    ",
    // 6: the drift sweep's findings: one row per Agent (or stray thing) per host or cluster.
    "
    CREATE TABLE drift (
        target TEXT NOT NULL,
        namespace_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT,
        message TEXT NOT NULL,
        checked_at INTEGER NOT NULL,
        PRIMARY KEY (target, namespace_id, agent_id)
    );
    ",
    // 7: what a failed activation does per Agent (restore: none | last-served).
    "
    ALTER TABLE agents ADD COLUMN restore TEXT NOT NULL DEFAULT 'none';
    ",
    // 8: rollouts (one Configuration generation to many Agents, in waves) and their Agents.
    "
    CREATE TABLE rollouts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        namespace_id TEXT NOT NULL REFERENCES namespaces(id) ON DELETE CASCADE,
        configuration_id TEXT NOT NULL,
        configuration_generation INTEGER NOT NULL,
        canary INTEGER NOT NULL,
        max_parallel INTEGER NOT NULL,
        max_failures INTEGER NOT NULL,
        pause_between_seconds INTEGER NOT NULL,
        manual_promote INTEGER NOT NULL,
        state TEXT NOT NULL,
        wave INTEGER NOT NULL DEFAULT 0,
        waves INTEGER NOT NULL,
        next_wave_at_ms INTEGER,
        message TEXT,
        created_by TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE INDEX rollouts_open ON rollouts(state);
    CREATE TABLE rollout_agents (
        rollout_id INTEGER NOT NULL REFERENCES rollouts(id) ON DELETE CASCADE,
        namespace_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        wave INTEGER NOT NULL,
        state TEXT NOT NULL,
        revision_id TEXT,
        work_id INTEGER,
        code TEXT,
        message TEXT,
        started_at INTEGER,
        finished_at INTEGER,
        PRIMARY KEY (rollout_id, agent_id)
    );
    CREATE INDEX rollout_agents_agent ON rollout_agents(namespace_id, agent_id);
    ",
    // 9: initial workspace files (store/workspace.rs): their setup state per Agent, and per
    // file its name, size, digest and, until an activation after the host applied them, its
    // content.
    "
    CREATE TABLE agent_workspace (
        namespace_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        state TEXT NOT NULL,
        applied_at INTEGER,
        failure_code TEXT,
        failure_message TEXT,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (namespace_id, agent_id),
        FOREIGN KEY (namespace_id, agent_id) REFERENCES agents(namespace_id, id) ON DELETE CASCADE
    );
    CREATE TABLE agent_workspace_files (
        namespace_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        name TEXT NOT NULL,
        size INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        content BLOB,
        PRIMARY KEY (namespace_id, agent_id, name),
        FOREIGN KEY (namespace_id, agent_id) REFERENCES agents(namespace_id, id) ON DELETE CASCADE
    );
    ",
    // 10: several coordinators: a claim token per work item (only the current claim may publish
    // its result), a fence per Agent (from one counter that only grows, taken by every claim of
    // its work and carried by its operations, so even a re-created Agent's fences are higher
    // than its earlier incarnation's), the leader lease of the singleton loops, and indexes
    // that keep the claim query independent of the queue's length.
    "
    ALTER TABLE work ADD COLUMN claim_token INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE agents ADD COLUMN fence INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE fence_counter (id INTEGER PRIMARY KEY CHECK (id = 1), value INTEGER NOT NULL);
    INSERT INTO fence_counter (id, value) VALUES (1, 0);
    CREATE TABLE leader (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        term INTEGER NOT NULL,
        lease_until INTEGER NOT NULL
    );
    CREATE INDEX work_lane ON work(namespace_id, agent_id, state);
    CREATE INDEX work_open ON work(state, not_before, id);
    CREATE INDEX audit_at ON audit(at);
    ",
    // 11: how a host is reached: the login user where root login is forbidden, and the jump
    // host (its typed record as JSON: address, port, pinned key, login user); placement
    // counts a host's Agents by index.
    "
    ALTER TABLE hosts ADD COLUMN login_user TEXT;
    ALTER TABLE hosts ADD COLUMN jump TEXT;
    CREATE INDEX agents_host ON agents(host_name);
    ",
    // 12: the claim's indexes, each over open rows only so it stays the size of the queue, not
    // of its history: a Namespace's open items in queue order (the lane checks), and running
    // items by lease (lapsed claims). And each Agent's revision floor: the highest revision
    // number a target reported that this database had not issued (after a restore from an
    // older backup), so numbering continues above it.
    "
    CREATE INDEX work_open_lane ON work(namespace_id, id) WHERE state IN ('queued', 'running');
    CREATE INDEX work_lapsed ON work(lease_until) WHERE state = 'running';
    ALTER TABLE agents ADD COLUMN revision_floor BIGINT NOT NULL DEFAULT 0;
    ",
    // 13: encryption at rest (store/src/seal.rs): whether a workspace file's content is sealed
    // (rows from before are in clear until the store seals them when it opens). Sealed cluster
    // credentials carry their own prefix. And the plan tokens already applied (each applies
    // once).
    "
    ALTER TABLE agent_workspace_files ADD COLUMN sealed INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE plan_tokens_used (token TEXT PRIMARY KEY, used_at INTEGER NOT NULL);
    ",
    // 14: secrets of a Namespace (store/src/sqlite/secrets.rs): one row per version, its value
    // sealed (store/src/seal.rs); the last version issued per name, kept after a delete so a
    // version is never reused; and the secret versions each revision was deployed with (JSON
    // list of name, version, fingerprint).
    "
    CREATE TABLE secret_names (
        namespace_id TEXT NOT NULL REFERENCES namespaces(id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        last_version INTEGER NOT NULL,
        PRIMARY KEY (namespace_id, name)
    );
    CREATE TABLE secrets (
        namespace_id TEXT NOT NULL,
        name TEXT NOT NULL,
        version INTEGER NOT NULL,
        fingerprint TEXT NOT NULL,
        value BLOB NOT NULL,
        written_by TEXT NOT NULL,
        written_at INTEGER NOT NULL,
        PRIMARY KEY (namespace_id, name, version),
        FOREIGN KEY (namespace_id, name) REFERENCES secret_names(namespace_id, name) ON DELETE CASCADE
    );
    ALTER TABLE revisions ADD COLUMN secrets TEXT NOT NULL DEFAULT '[]';
    ",
    // 15: whether a prepare of the revision was ever sent to a target (`staged`): a revision
    // that never reached one is retired in the store alone, without a host call. Rows from
    // before are taken as staged (they may have been).
    "
    ALTER TABLE revisions ADD COLUMN staged INTEGER NOT NULL DEFAULT 1;
    ",
    // 16: rollouts of a secret's newest version (`occ secret rotate`): each Agent keeps its
    // Configuration generation and binds the newest version. Such a row names the secret and
    // the version it was created for, with configuration_id '' and generation 0 (the columns
    // stay NOT NULL; `rollout_row` reads them as no Configuration).
    "
    ALTER TABLE rollouts ADD COLUMN secret_name TEXT;
    ALTER TABLE rollouts ADD COLUMN secret_version INTEGER;
    ",
    // 17: an Agent's own egress settings (issue 28): `clawfleet_protocol::egress::Egress` as
    // JSON, NULL for none (its target's policy).
    "
    ALTER TABLE agents ADD COLUMN egress TEXT;
    ",
];
