"""Local web servers etlab starts (Model Explorer; the dashboard to come) and the HTTP guard they share."""
