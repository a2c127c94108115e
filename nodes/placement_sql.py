"""The SQL fragments of placement, per database vendor: a card's room (`ROOM_SQL`), the
room by what was sold alone (`SOLD_ROOM_SQL`) and the whole-card rule (`WHOLE_CARD_SQL`).
Constants only: `nodes.services.allocations` runs them (and `nodes.selectors.placement_shortfall`
reads `SOLD_ROOM_SQL`)."""

# placement.nominal_mb and Candidate.capacity_mb in SQL, in integers where possible;
# capacity is rounded down (FLOOR; SQLite's CAST truncates, the same for positives).
# The PostgreSQL form is also the expression of the index nodes_gpu_room_idx
# (migration 0004): change both together (test_room_index_serves_placement).
_NEAREST = "((vram_total_mb + 512) / 1024 * 1024)"
_NOMINAL = (
    f"CASE WHEN {_NEAREST} >= vram_total_mb AND ({_NEAREST} - vram_total_mb) * 50 <= {_NEAREST} "
    f"THEN {_NEAREST} ELSE vram_total_mb END"
)
_CAPACITY = {
    "postgresql": f"FLOOR(({_NOMINAL}) * overcommit_ratio)::integer",
    "sqlite": f"CAST(({_NOMINAL}) * overcommit_ratio AS INTEGER)",
}
# A card's room counts what it really holds: the larger of what was sold on it and what
# its processes hold (memory used outside the platform, a library that undercounts).
_HELD = {
    "postgresql": "GREATEST(allocated_mb, COALESCE(last_processes_mb, 0))",
    "sqlite": "MAX(allocated_mb, COALESCE(last_processes_mb, 0))",
}
ROOM_SQL = {vendor: f"({cap} - {_HELD[vendor]})" for vendor, cap in _CAPACITY.items()}
# A card sold whole only (no proven quota library) takes one slice, of the whole card.
WHOLE_CARD_SQL = {
    vendor: f"(NOT whole_card_only OR ({held} = 0 AND %s >= {_NOMINAL}))"
    for vendor, held in _HELD.items()
}
# The room by what was sold alone (why a launch waits: placement_shortfall).
SOLD_ROOM_SQL = {vendor: f"({cap} - allocated_mb)" for vendor, cap in _CAPACITY.items()}


# A node whose agent is absent, old or not answering (nodes.models.AGENT_BLOCKS) takes no
# new slices: the row that says so, for placement's one statement (n is the node).
AGENT_BLOCKS_SQL = (
    "SELECT 1 FROM nodes_nodeagent a WHERE a.node_id = n.id "
    "AND a.state IN ('absent', 'old', 'silent')"
)
# A node whose agent runs now (nodes.agent_models.AgentState.OK): the only nodes an image
# a renter brought under "any image" may land on (docs/images.md).
AGENT_RUNNING_SQL = "SELECT 1 FROM nodes_nodeagent a WHERE a.node_id = n.id AND a.state = 'ok'"
