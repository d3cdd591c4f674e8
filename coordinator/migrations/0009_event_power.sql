-- The power level an attempt ran under, as its agent applied it (issue 17):
-- the JSON of the event's `power` (requested, in force, frequency ceiling in
-- kHz), NULL for events that carry none (older agents, accepted events,
-- events of forwarded attempts).
ALTER TABLE events ADD COLUMN power TEXT;
