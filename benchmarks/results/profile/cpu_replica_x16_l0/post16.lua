wrk.method="POST"
wrk.headers["Content-Type"]="application/json"
local f=io.open("/tmp/prof0/body16.json"); wrk.body=f:read("*a"); f:close()
