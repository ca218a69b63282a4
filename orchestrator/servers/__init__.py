"""Local web servers etlab starts (Model Explorer, the dashboard) and the HTTP guard they share."""
