"""English dates in the console: month names, never the US numeric form. "12/02/2026" reads
as 12 February to most of the world and as 2 December in the US; "Dec. 2, 2026" reads one way
everywhere. Everything else comes from Django's English formats."""

SHORT_DATE_FORMAT = "N j, Y"
SHORT_DATETIME_FORMAT = "N j, Y, P"
