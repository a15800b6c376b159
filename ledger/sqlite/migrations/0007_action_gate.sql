-- 0007: an action records the gate's decision and why: the state the gate
-- chose (gate_decision), the rule that chose it (gate_rule, its 0-based
-- index in the rules file, -1 when the default decided), the reason in
-- words and the digest of the rule set in force, defaults included. The
-- four are set together when the action is recorded and never change.
--
-- Actions recorded before this migration have all four NULL: recorded
-- before the gate was audited. Their content, which the chain binds, has no
-- gate, so their digests stay as they were.
ALTER TABLE actions ADD COLUMN gate_decision TEXT
    CHECK (gate_decision IN ('approved','awaiting_approval','denied'));
ALTER TABLE actions ADD COLUMN gate_rule INTEGER
    CHECK (gate_rule >= -1 AND (gate_rule IS NULL) = (gate_decision IS NULL));
ALTER TABLE actions ADD COLUMN gate_reason TEXT
    CHECK ((gate_reason IS NULL) = (gate_decision IS NULL));
ALTER TABLE actions ADD COLUMN rules_digest TEXT
    CHECK (rules_digest LIKE 'sha256:%' AND (rules_digest IS NULL) = (gate_decision IS NULL));
