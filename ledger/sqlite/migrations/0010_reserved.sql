-- 0010: reserved for the rule-sets migration of another branch, which
-- replaces this file when both are merged. Versions run without gaps.
SELECT 1;
