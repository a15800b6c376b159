-- 0002: a submitter lists its own runs (GET /v1/runs for the submitter role)
-- without reading the tenant's.
CREATE INDEX runs_tenant_submitter ON runs (tenant, submitted_by, id);
