-- A pending task no online node could take is parked: the scheduler writes
-- the fingerprint of the fleet it found it unrunnable on, and reads it again
-- only once the fleet's fingerprint differs (issue 33: work nothing can run
-- must not fill the window the policy reads). NULL: not parked.
ALTER TABLE tasks ADD COLUMN parked_fleet BIGINT;
